"""The cap on classifier uploads of a method whose cost grows with each teacher (its option
max_teachers), and the refusal past it, the same before the ingest as after."""

from __future__ import annotations

from edgefl.errors import ConfigError, FusionError

# Data-free methods distil every classifier at every step: on 2 CPUs FedHydra took 143 s for 20
# teachers and over 15 minutes for 200, DENSE 57 s and 350 s (bench/results/scale.md). Past
# this many, a run would take hours on such a server; each such method refuses it up front.
MAX_TEACHERS = 500
MAX_TEACHERS_HELP = (
    "refuse more classifier uploads than this (0: no cap); their cost grows with each"
)


# A method with the option committee forwards a random committee of that many teachers each
# generator step instead of every teacher: its time then stays that of `committee` teachers
# however many uploaded, and max_teachers caps the committee instead of the uploads.
COMMITTEE_HELP = (
    "teachers each generator step uses, drawn at random anew each step (0: every teacher): "
    "its time no longer grows with the uploads, and max_teachers then caps the committee"
)


# The committee a refusal offers: the largest that needs no checkpointing (generator.
# CHECKPOINT_GROUP). DENSE over 2,000 teachers: 338 s and 46.41 % with it, 1,035 s and 44.88 %
# with 200, 46.00 % with all of 500 of them (bench/results/dense_committee_10k.md).
COMMITTEE = 64


def check_committee(cfg) -> None:
    """A committee larger than max_teachers is refused when the config is built, before any
    file is read."""
    if cfg.committee and cfg.max_teachers and cfg.committee > cfg.max_teachers:
        raise ConfigError(
            f"--committee {cfg.committee} is more than --max-teachers {cfg.max_teachers}",
            hint=f"e.g. --committee {min(COMMITTEE, cfg.max_teachers)}, or raise --max-teachers",
        )


def scale_options(cfg) -> tuple[str, ...]:
    """The options a refusal past max_teachers offers to bound the time: a committee, and what
    else the method needs at that scale, for its time or its accuracy (its config's AT_SCALE);
    () without a committee."""
    if not hasattr(cfg, "committee"):
        return ()
    wanted = getattr(cfg, "COMMITTEE_AT_SCALE", COMMITTEE)  # a method's own where measured
    size = min(cfg.max_teachers or wanted, wanted)
    return (f"committee={size}", *getattr(cfg, "AT_SCALE", ()))


def upload_cap(cfg) -> int:
    """The most classifier uploads `cfg` takes: max_teachers, none with a committee (0: no cap)."""
    if getattr(cfg, "committee", 0):
        return 0
    cap = getattr(cfg, "max_teachers", 0)
    return cap if isinstance(cap, int) and cap > 0 else 0


GROWS = "its cost grows with each teacher"  # a capped method that says no more (teacher_cost)

# One generator step's forward and backward through one `cnn`-sized teacher at batch 64 on 2
# CPUs: 2,000 teachers took 50.8 s a step (bench/results/generator_memory.md, 2026-11-29).
TEACHER_STEP_S = 50.8 / 2000


def generator_estimate(cfg, teachers: int) -> str:
    """For a generator method's config (epochs x gen_steps steps on batches of batch_size), the
    least time its generator steps take through `teachers`, in words to add to its refusal;
    "" for a config without generator steps. A lower bound: a method's other passes (FedHydra's
    stratification and finishing steps, Co-Boosting's perturbation) come on top."""
    steps = getattr(cfg, "epochs", 0) * getattr(cfg, "gen_steps", 0)
    if not steps:
        return ""
    seconds = steps * teachers * TEACHER_STEP_S * getattr(cfg, "batch_size", 64) / 64
    return (
        f" (at least {steps:,} generator steps through each: {_duration(seconds)} or more on 2 "
        "CPUs for cnn-sized teachers)"
    )


def _duration(seconds: float) -> str:
    if seconds >= 5400:
        return f"about {seconds / 3600:.1f} hours"
    minutes = round(seconds / 60)
    return f"about {minutes} minutes" if minutes > 1 else "about a minute"


def over_caps(configured, classifiers: int, flag: str = "--opt") -> dict[str, FusionError]:
    """Each (method, config) of `configured` that `classifiers` classifier uploads put over its
    max_teachers, by name, with its refusal (`flag`: the command's option flag the fix names)."""
    refused = {}
    for method, cfg in configured:
        error = method.over_cap(cfg, classifiers, flag)
        if error is not None:
            refused[method.name] = error
    return refused


def too_many(
    method: str,
    kind: str,
    count: int,
    at_most: int,
    cost: str,
    flag: str = "--opt",
    scale: tuple[str, ...] = (),
) -> FusionError:
    """The refusal of `count` uploads of `kind`, more than the method's max_teachers `at_most`
    (`cost`: what grows with each; `scale`: the options that bound its time, a committee's
    first): the same words before the ingest (from what the files declare) as after it."""
    scoped = f"{method}:" if method else ""
    bounded = ""
    if scale:
        size = scale[0].partition("=")[2]
        opts = " ".join(f"{flag} {scoped}{o}" for o in scale)
        bounded = f"{opts} bounds its time (a random {size} teachers each step); "
    return FusionError(
        f"{method or 'this method'} refuses {count:,} {kind} uploads, more than its "
        f"max_teachers ({at_most:,}): {cost}",
        hint=f"{bounded}{flag} {scoped}max_teachers={count} runs it anyway (a GPU helps); "
        "fedmho-md, fedcvae-ens and ensemble fuse 10,000 uploads in minutes "
        "(docs/performance.md)",
    )
