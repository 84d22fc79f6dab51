"""The night's time shared by Amdahl's law: each kernel gets time in proportion to what it may still save.

A kernel type takes a share f of the model's time. What more work on it can save is the part of that share
between what the model will spend on the type (its kernel's time where the kernel is faster than what the model
runs there, else the model's own: the prune leaves a slower kernel out) and the roofline's time for the same calls
(the least any kernel could take). Before a kernel's baseline ran on a GPU, its time is the profiled time over its
speedup s in the plan (plan.py), and the roofline's the plan's floor_us (profile.py computes it on a GPU); after, its
time in the model (fraction_left) and its fraction of peak over the model's shapes (the harness's model_pct_peak,
so a shape far from its roofline that the model calls often weighs as it should). So a type the deploy mode would
prune today (s < 1, as the matmul type against cuBLAS) is ranked by what it would save once the night makes it win,
not queued blindly. Kernels are worked on in order of potential, and each, when it starts, gets the time left times
its share of the potential of the kernels not done yet (parked ones included: they come back in the next round,
when the time left is shared again the same way); a kernel done early leaves its time to the others. A type the plan
expects no gain from and whose roofline is unknown (a plan made on the CPU) has no potential: it waits, parked,
until the others are done, and then gets the time they leave. An opt-in type and its rivals (extract.py writes them
beside it: rope_attention, and flash_attention with rotary_embedding, which cover the same time) count once: the side
the model would deploy now, as report.amdahl and verify's prune choose, gets its potential, and the other side waits
as a no-gain type does, for the time the others leave; a rival whose opt-in type is not queued keeps its own. Which
side that is, the plan alone cannot say: its s are the starters' speedups at the bench's shapes, and on an H200 a
Qwen3 night gave rope_attention 13 of its 18 minutes (1.31x at the model's shape) while the model ran flash_attention
and rotary_embedding 1.11x faster than it (verify's prune). So every side of a rivalry is timed at the model's shapes
(its baseline) before the split trusts it (time_first, undecided): the baselines of a rivalry come first in the queue,
and a side timed waits for the others' before it works on. Kernels given by hand (--kernel, no plan share) split the
time evenly.
"""

from __future__ import annotations

from autokernel.profile.plan import fraction_left, room

NO_GAIN = 1.0 + 1e-9  # a plan gain at or under this means the type cannot speed the model up


def potential(job: dict) -> float | None:
    """Share of the model's time the kernel may still save, on its own (potentials() weighs rivals); None for a
    kernel without a plan share."""
    f = job.get("f")
    if f is None:
        return None
    if not f:  # no time in the deploy mode
        return 0.0
    on_gpu, in_model, speedup = _measured(job)
    left = left_of(job)
    floor = _floor(job, on_gpu, in_model, speedup)
    if floor is None:
        if job.get("gain") is not None and job["gain"] <= NO_GAIN:
            return 0.0
        return f * left
    return room(f, left, floor)


def _measured(job: dict) -> tuple[bool, bool, float | None]:
    """Whether the kernel ran on a GPU, whether its time is the model's, and its speedup over PyTorch."""
    on_gpu = job.get("measured_on") == "cuda"
    in_model = on_gpu and job.get("objective") == "model_us"
    return on_gpu, in_model, (job.get("best_vs_pytorch") if on_gpu else None) or job.get("s")


def left_of(job: dict) -> float:
    """What is left of the type's profiled time with the kernel deployed (plan.fraction_left), at most 1."""
    _, in_model, speedup = _measured(job)
    return fraction_left(job.get("time_us"), job.get("best_us"), in_model, speedup)


def rivals_of(job: dict, jobs: list[dict]) -> list[dict]:
    """The jobs that rival the kernel's (opt-in) type: those whose rival_of names it."""
    return [r for r in jobs if r is not job and job.get("type") and job["type"] in (r.get("rival_of") or [])]


def untimed(job: dict) -> bool:
    """Whether the kernel is queued (pending or at work) with no baseline tried yet: its time at the model's shapes
    is the plan's guess."""
    return job["status"] in ("pending", "active") and job.get("baseline_sha") is None and not job.get("experiments")


def rivalries(jobs: list[dict]) -> list[list[dict]]:
    """Each queued opt-in type with its rivals (rivals_of), the opt-in type first."""
    return [[job, *rivals_of(job, jobs)] for job in jobs if rivals_of(job, jobs)]


def time_first(jobs: list[dict]) -> set[str]:
    """The kernels whose baselines come before all else: the untimed sides of every rivalry."""
    return {j["name"] for group in rivalries(jobs) for j in group if untimed(j)}


def undecided(job: dict, jobs: list[dict]) -> bool:
    """Whether a rivalry the kernel is in still has an untimed side: which side the model runs is not known yet."""
    return any(any(j is job for j in group) and any(untimed(j) for j in group) for group in rivalries(jobs))


def outrun(jobs: list[dict]) -> dict[str, list[str]]:
    """{name: the kernels the model would deploy in its place now} for each kernel whose rival side wins, chosen as
    report.amdahl does: an opt-in type P is deployed where f_P * left_P <= max(0, f_P - sum f_R) + sum f_R * left_R
    over its rivals R, else they are. Done kernels count (their best time is known). A rival that some group
    deploys is not outrun."""
    lost, won = {}, set()
    for primary in jobs:
        theirs = rivals_of(primary, jobs)
        if not theirs or primary.get("f") is None:
            continue
        f = primary["f"]
        own = f * left_of(primary)
        instead = (max(0.0, f - sum(r.get("f") or 0.0 for r in theirs))
                   + sum((r.get("f") or 0.0) * left_of(r) for r in theirs))
        if own <= instead:
            for r in theirs:
                lost.setdefault(r["name"], []).append(primary["name"])
        else:
            lost[primary["name"]] = [r["name"] for r in theirs]
            won.update(r["name"] for r in theirs)
    return {name: side for name, side in lost.items() if name not in won}


def potentials(jobs: list[dict]) -> dict[str, float | None]:
    """Each kernel's potential over the whole queue: 0 for a side its rivals outrun (outrun), else its own."""
    waiting = outrun(jobs)
    return {j["name"]: 0.0 if j["name"] in waiting else potential(j) for j in jobs}


def _floor(job: dict, on_gpu: bool, in_model: bool, speedup) -> float | None:
    """The roofline's time for the kernel's calls over the time the profile measured for its type, or None: from the
    kernel's measured fraction of peak once it ran on a GPU, else from the plan's floor_us."""
    peak, time_us = job.get("best_pct_peak") if on_gpu else None, job.get("time_us")
    if peak:
        # the kernel's time over the profiled one, unclipped: the fraction of peak is of the kernel's own time
        ratio = job["best_us"] / time_us if in_model and job.get("best_us") and time_us else 1 / max(speedup or 1, 1e-9)
        return ratio * float(peak) / 100
    return job["floor_us"] / time_us if job.get("floor_us") and time_us else None


def shares(jobs: list[dict]) -> dict[str, float]:
    """Each unfinished kernel's fraction of the time left (summing to 1, or to 0 with nothing to do)."""
    todo = [j for j in jobs if j["status"] != "done"]
    every = potentials(jobs)  # the done ones still decide which rival side the model runs
    weights = {j["name"]: every[j["name"]] for j in todo}
    if any(w is None for w in weights.values()) or not sum(weights.values()):
        return {name: 1.0 / len(todo) for name in weights}  # by hand, or only no-gain types left: evenly
    total = sum(weights.values())
    return {name: w / total for name, w in weights.items()}


def parallel_minutes(jobs: list[dict], hours: float, slots: int, per_kernel: float | None = None) -> dict:
    """Minutes per kernel when `slots` GPUs work at once (--gpus, --ray): --per-kernel-minutes, else each
    kernel's share of the slots' hours, at most the run's; a type with nothing to gain, or outrun by its rivals,
    runs last, until the end."""
    if per_kernel:
        return {j["name"]: per_kernel for j in jobs}
    split = shares([{**j, "status": "pending"} for j in jobs])
    run = hours * 60
    return {name: min(run, share * run * min(slots, len(jobs))) if share else run for name, share in split.items()}


def order(jobs: list[dict]):
    """Sort key of the queue `jobs` (or of any part of it): the untimed sides of rivalries first (time_first), then
    most potential first, no-gain types and the sides their rivals outrun (potentials) last, then the plan's gain."""
    every, first = potentials(jobs), time_first(jobs)

    def key(job: dict) -> tuple:
        p = every[job["name"]] if job["name"] in every else potential(job)
        return (job["name"] not in first, p == 0.0, -(p or 0.0), -(job.get("gain") or 0.0))

    return key


def waiting_reason(job: dict, jobs: list[dict]) -> str | None:
    """Why the kernel gets no share while others have one: a no-gain type, or a side its rivals outrun; else None."""
    side = outrun(jobs).get(job["name"])
    if side and job.get("rival_of"):
        return f"a rival of {' and '.join(side)}, which the model runs faster now"
    if side:
        return f"its rival{'s' if len(side) > 1 else ''} {' and '.join(side)} run{'' if len(side) > 1 else 's'} " \
               "faster in the model now"
    return "nothing to gain over PyTorch" if potential(job) == 0.0 else None


def describe(jobs: list[dict], seconds_left: float) -> list[str]:
    """What the run says about the split, one line per kernel not done."""
    split, every, waiting = shares(jobs), potentials(jobs), outrun(jobs)
    first = sorted(time_first(jobs))
    lines = [f"  first the baselines of {', '.join(first)}: their times at the model's shapes decide which side of a "
             "rivalry the model runs (until then, the plan's guess below)"] if first else []
    for job in sorted((j for j in jobs if j["status"] != "done"), key=order(jobs)):
        name, p = job["name"], every[job["name"]]
        idle = waiting_reason(job, jobs) if name in waiting else \
            f"plan gain {job.get('gain') or 1.0:.3f}x, nothing to gain over PyTorch"
        if p == 0.0 and split[name] == 0.0:
            lines.append(f"  {name}: {idle}: queued last, on the time the others leave")
            continue
        why = f"may still save {p:.1%} of the model's time" if p else "no plan share: even split" if p is None else idle
        minutes = split[name] * seconds_left / 60
        lines.append(f"  {name}: {split[name]:.0%} of the time left (~{minutes:.0f} min; {why})")
    return lines
