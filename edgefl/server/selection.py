"""Stage select: the uploads each method uses, read from its contract (the kinds it consumes,
whether it needs rebuilt modules), less those the robust screen leaves out (one verdict per
ingest, shared by the methods) and those the method itself sets aside; and, for those it went
without, why."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from edgefl.artifacts import Upload
from edgefl.errors import FusionError
from edgefl.fusion.base import FusionContext, Method
from edgefl.fusion.config import PublicSetConfig
from edgefl.fusion.screen import apply as apply_screen
from edgefl.fusion.screen import judge as judge_screen
from edgefl.server.ingest import Ingest
from edgefl.server.plan import FuseRun, Planned


def select(method: Method, found: Ingest) -> tuple[list[Upload], list[tuple[str, str]]]:
    """(the uploads the method uses, (file, why not) for the others), from its contract."""
    usable = [u for u in found.uploads if u.kind in method.consumes]
    skipped = [
        (u.name, f"{u.kind} artifacts are not used by {method.name}")
        for u in found.uploads
        if u.kind not in method.consumes
    ]
    if method.needs_modules:
        for u in [u for u in usable if not u.rebuilt]:
            skipped.append(
                (u.name, f"{method.name} needs a rebuilt torch module: {u.forward_only}")
            )
        usable = [u for u in usable if u.rebuilt]
    if not usable:
        raise FusionError(
            f"none of the {len(found.uploads)} accepted uploads can be used by {method.name} "
            f"(it consumes: {', '.join(method.consumes)})"
            + why_not(found.rejected, skipped, found.folders),
            hint="`edgefl server methods` lists what each method needs",
        )
    return usable, skipped


def why_not(
    rejected: list[tuple[str, str]],
    skipped: list[tuple[str, str]],
    folders: list[tuple[str, str]] = (),
    screened: list[dict[str, Any]] = (),
) -> str:
    """Every upload a method went without, and why: a run that fails for want of uploads names
    them (a count alone left users guessing why their own models were refused), those the
    robust screen set aside (`robust.apply`'s entries) included. One line per upload: its name
    and reason are shown with control characters escaped, newlines included, so that a file
    whose name holds a newline cannot forge a line of the message."""
    from edgefl.progress import printable

    lines = [f"\n  rejected {printable(n)}: {printable(r)}" for n, r in rejected]
    lines += [f"\n  not used {printable(n)}: {printable(r)}" for n, r in skipped]
    lines += [f"\n  not read folder {printable(n)}: {printable(r)}" for n, r in folders]
    lines += [
        f"\n  set aside by --robust screen {printable(s['file'])} ({printable(s['kind'])}): "
        f"{printable(s['reason'])}"
        for s in screened
    ]
    return "".join(lines)


@dataclass(frozen=True)
class Used:
    """What one method fuses: the uploads it uses, and (file, why not) for those it does not;
    with --robust screen, those screened out, the screen's notes and its verdict."""

    usable: list[Upload]
    skipped: list[tuple[str, str]]
    screened: list = field(default_factory=list)
    notes: list = field(default_factory=list)
    verdict: Any = None


def uses(p: Planned, run: FuseRun) -> Used:
    """The uploads the method's contract admits, less those the robust screen leaves out."""
    usable, skipped = select(p.method, run.found)
    if p.config.robust != "screen":
        return Used(usable, skipped)
    verdict = screen_verdict(p, run.found, run.device, run.log)
    usable, screened, notes = apply_screen(
        verdict, usable, lambda m: run.log(f"{p.method.name}: {m}")
    )
    if not usable:
        raise FusionError(
            f"{p.method.name}: every upload it could use was screened out",
            hint="see the reasons above; --robust off fuses them all",
        )
    return Used(usable, skipped, screened, notes, verdict)


def set_aside(p: Planned, used: Used, ctx: FusionContext, log) -> Used:
    """What the method itself set aside (FedAvg's other architectures) joins the pipeline's."""
    aside = {id(u) for u, _ in ctx.aside}
    usable = [u for u in used.usable if id(u) not in aside]
    skipped = used.skipped + [(u.name, why) for u, why in ctx.aside]
    if ctx.aside:  # the line before the fusion counted them as used
        log(f"{p.method.name}: {len(usable)} upload(s) used in the end, {len(ctx.aside)} set aside")
    return replace(used, usable=usable, skipped=skipped)


def screen_verdict(p: Planned, found: Ingest, device, log, progress=None):
    """The robust screen's verdict on the ingest for this method's seed and probe, judged the
    first time a method asks and kept with the ingest for the others (the decoders' draws, or
    else the method's public set, are the probe: with decoders the public set plays no part)."""
    cfg = p.config
    public = cfg.public_args() if isinstance(cfg, PublicSetConfig) else None
    decoders = any(u.kind == "decoder" for u in found.uploads)
    key = (cfg.seed, None if decoders or public is None else tuple(public.items()))
    if key not in found.screens:
        found.screens[key] = judge_screen(
            found.uploads, device, cfg.seed, public=lambda: _public_probe(public), progress=progress
        )
        v = found.screens[key]
        log(
            f"robust screen ({v.seconds:.1f}s): {len(v.out)} upload(s) screened out, "
            f"{len(v.swap)} used changed"
        )
    return found.screens[key]


def _public_probe(public: dict | None):
    """The public set's samples, for the robust screen to probe with (read only when used)."""
    if public is None:
        return None
    from edgefl.data.public import load_public

    return load_public(**public)
