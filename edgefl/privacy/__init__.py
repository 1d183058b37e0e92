"""Differential privacy on the device (issue 57): DP-SGD training and the accountant that sets
its noise. `DPConfig` is what a user asks for; `plan_dp` finds the noise, sampling rate and steps
that deliver it (the `DPPlan` an upload records); `edgefl.privacy.dpsgd.dp_train_epoch` trains one
epoch under that plan (imported from there: it loads torch, which parsing a flag should not).
"""

from edgefl.privacy.accountant import epsilon, noise_for
from edgefl.privacy.config import DPConfig, DPPlan, plan_dp, steps_per_epoch

__all__ = ["DPConfig", "DPPlan", "epsilon", "noise_for", "plan_dp", "steps_per_epoch"]
