"""What `edgefl deploy` reports: every file with its size, measured memory, latency, accuracy."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True)
class DeployReport:
    model: str
    target: str
    runtime: str
    profile: dict[str, Any]
    quantization: str | None
    files: list[dict[str, Any]]  # path, what, bytes
    runtime_figures: dict[str, Any]  # memory_bytes (+ what), latency_ms_per_sample, ...
    cost_estimate: dict[str, Any]
    accuracy: dict[str, Any] | None  # on --eval: the deployed file against the fp32 source
    eval_ref: str | None
    parity: dict[str, Any] | None  # without --eval: agreement with the source on probe inputs

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def lines(self) -> list[str]:
        """The human report, one fact a line."""
        fig = self.runtime_figures
        out = [
            f"{self.model} -> {self.target} for {self.profile['name']} "
            f"({self.quantization or 'fp32'}, runtime {self.runtime})"
        ]
        for f in self.files:
            out.append(f"  {f['path']}  {f['bytes']:,} bytes  ({f['what']})")
        if fig.get("memory_bytes") is not None:
            out.append(
                f"  memory: {fig['memory_bytes']:,} bytes ({fig['memory_what']}); "
                f"budget {self.profile['ram_budget_bytes']:,}"
            )
        if "flash_bytes" in fig:
            out.append(
                f"  flash: {fig['flash_bytes']:,} bytes; storage {self.profile['storage_bytes']:,}"
            )
        arena = self.cost_estimate.get("estimated_tflm_arena_bytes")
        est = self.cost_estimate.get("estimated_infer_peak_bytes")
        if "flash_bytes" in fig and arena is not None:
            out.append(
                f"  cost model: TFLite Micro arena {arena:,} bytes (int8 activations + "
                "persistent data; weights in flash)"
            )
        elif est is not None:
            out.append(
                f"  cost model: peak inference memory {est:,} bytes (weights + largest step)"
            )
        out.append(f"  latency: {fig['latency_ms_per_sample']:.3f} ms per sample on this machine")
        for ep, v in (fig.get("mobile_usability") or {}).items():
            out.append(
                f"  {ep}: {v['supported_nodes']}/{v['nodes']} nodes supported in "
                f"{v['partitions']} partition(s): {v['verdict']}"
            )
        if self.accuracy:
            a = self.accuracy
            drop = a["accuracy_drop_points"]
            change = (
                f"{abs(drop):.2f} points {'lost' if drop > 0 else 'gained'}" if drop else "same"
            )
            out.append(
                f"  accuracy on {self.eval_ref} ({a['samples']:,} samples): "
                f"{100 * a['accuracy']:.2f}% deployed vs {100 * a['accuracy_fp32']:.2f}% "
                f"fp32 source ({change}); same class on {100 * a['argmax_agreement']:.1f}%"
            )
        elif self.parity:
            p = self.parity
            out.append(
                f"  vs the fp32 source on {p['samples']} probe inputs: max logit difference "
                f"{p['max_abs_logit_diff']:.3g}, same class on "
                f"{100 * p['argmax_agreement']:.1f}% (add --eval DATASET:SPLIT for "
                "accuracy)"
            )
        return out
