"""The builtin agent's wide search: configurations drawn from the whole space, screened, the best proposed.

One knob at a time from a tuned starter finds little: the gains are in other variants with other tiles (a TMA
GEMM wants other blocks and stages than the grouped one), and in a different configuration at each model shape.
So the agent draws configurations from the whole space of the file's TUNABLES: the configuration it has now (what
the others must beat), single moves from it (up to half the screen: each one a screen times costs a fraction of a
second, where the coordinate search would spend a whole experiment on it, 10-40 s on an H100), mutations of the best
configurations earlier screens found (two or three tunables changed at once) and the rest uniformly from the whole
space, never one already screened or tried. The harness's screen (autokernel/harness/screen.py) checks and times
them all at the model's shapes by successive halving, in one process. What it ranks above the current configuration
becomes the agent's next proposals, fastest first, each a loop experiment like any other (five stages, timing, a
confirmation before a keep); then, where the shapes disagree on their fastest configuration, a per-shape table
(builtin.apply_table).

A kernel is screened when the agent starts on it, again each time a keep changed its configuration, at once after
a screen that found nothing MIN_SCREEN_GAIN_PCT faster (the next draws other configurations and mutates the elite: a
screen times 64 in the time two or three experiments of the coordinate search take, and an H100 night's fused_mlp
spent five of those on single moves 12-266% slower), and after SCREEN_EVERY experiments of the coordinate search
without a keep; SCREEN_ROUNDS times at most. A screen that fails (a child that dies) turns screening off for that
kernel, and the coordinate search goes on alone.
"""

from __future__ import annotations

import json
import random

from autokernel.kernelfile import tunable_space

SCREEN_SIZE = 64  # configurations drawn per screen (48 took an H100 31-36 s at TinyLlama's shapes)
# configurations screened, and seconds after which a screen's first rung stops starting them, per device: on the
# CPU (Triton's interpreter) a screen shows that the path works, and its times rank nothing
SCREEN_LIMITS = {"cuda": (SCREEN_SIZE, 150.0), "cpu": (6, 30.0)}
SCREEN_ROUNDS = 8  # screens per kernel (a screen times 64 configurations in the time of one to three experiments)
SCREEN_EVERY = 12  # coordinate-search experiments between two screens when no keep changed the configuration
PROPOSALS = 3  # the screen's fastest configurations tried as experiments
MIN_SCREEN_GAIN_PCT = 1.0  # faster than the current configuration by this much in the screen to be proposed
ELITE = 6  # the best screened configurations the next screen mutates
# a single move from the configuration screened that the screen timed HOPELESS_PCT slower or more: the coordinate
# search makes no move to that value from it (a Qwen3 night's rope_attention moved to BLOCK_M 32, NUM_STAGES 1 and the
# "fused" variant, 1.3-3x slower, seven experiments and 4.4 of its 18 minutes, after a screen had timed each alone)
HOPELESS_PCT = 10.0


def key(config: dict) -> str:
    """A configuration as a string that names it whatever its order (the agent's memory keys on it)."""
    return json.dumps(config, sort_keys=True)


def draw(space: dict, best: dict, seed: int, seen: set[str], n: int = SCREEN_SIZE,
         elite: list[dict] | None = None) -> list[dict]:
    """Up to n configurations, `best` first, none of them in `seen` (keys) but best: up to half single moves from
    best, a quarter mutations of the elite (best among them), the rest drawn uniformly from the whole space."""
    rng = random.Random(f"screen:{seed}:{key(best)}")
    chosen, keys = [best], {key(best)}

    def add(config: dict) -> None:
        if len(chosen) < n and key(config) not in keys and key(config) not in seen:
            chosen.append(config)
            keys.add(key(config))

    names = sorted(space)
    singles = [{**best, name: v} for name in names for v in space[name] if v != best[name]]
    rng.shuffle(singles)
    for config in singles[:n // 2 - 1]:
        add(config)
    parents = [best] + list(elite or [])
    for _ in range(20 * n):
        if len(chosen) >= n * 3 // 4:
            break
        parent = rng.choice(parents)
        changed = rng.sample(names, min(len(names), rng.choice((2, 2, 3))))
        add({**parent, **{name: rng.choice(space[name]) for name in changed}})
    for _ in range(20 * n):
        if len(chosen) >= n:
            break
        add({name: rng.choice(space[name]) for name in names})
    return chosen


def drawn_from(source: str, n: int) -> list[dict]:
    """A kernel file's configuration first, then n - 1 drawn from its TUNABLES (seed 0): the same n configurations in
    the same order for every tool that ranks them two ways (scripts/l2_regimes.py, scripts/region_profile.py)."""
    space, best = tunable_space(source)
    return draw(space, best, seed=0, seen=set(), n=n)


def proposals(screened: dict, best: dict) -> list[dict]:
    """The queue a screen leaves: up to PROPOSALS configurations faster than `best` (the screen's first result)
    in the model by more than MIN_SCREEN_GAIN_PCT, fastest first, then one per-shape table (made when it comes
    up, against the configuration the file has then)."""
    results = [r for r in screened.get("results", []) if r["status"] == "timed"]
    line = _gain_line(results, best)
    if line is None:
        return []
    anchor_us, limit = line
    faster = sorted((r for r in results if r["model_us"] < limit), key=lambda r: r["model_us"])
    queue = [{"kind": "config", "config": r["config"], "screen_us": r["model_us"], "anchor_us": anchor_us}
             for r in faster[:PROPOSALS]]
    return queue + ([{"kind": "table"}] if len(screened.get("shapes", [])) > 1 else [])


def outdone(memory: dict, kept: dict, kept_us: float) -> None:
    """The agent's memory once `kept`, which the last screen timed at kept_us, is kept: the configurations that screen
    timed no faster than it by MIN_SCREEN_GAIN_PCT leave the queue and join those passed over (a Qwen3 night benched
    two after the screen's best was kept, 90 s for two foregone reverts); tables stay."""
    limit = kept_us * (1 - MIN_SCREEN_GAIN_PCT / 100)
    queue = memory.get("queue", [])
    memory["queue"] = [item for item in queue if item["kind"] != "config" or item["screen_us"] < limit]
    slower = {key(run["config"]) for run in memory.get("screen", {}).get("runs", [])
              if run.get("model_us", 0.0) >= limit} - {key(kept)}
    memory["passed_over"] = sorted(set(memory.get("passed_over", [])) | slower)


def passed_over(screened: dict, best: dict) -> set[str]:
    """The keys of the configurations a screen showed to be no experiment's worth: wrong or failed there, or timed
    no faster in the model than `best` by MIN_SCREEN_GAIN_PCT (an H100 night spent one on a tile the screen had
    timed 0.04% faster). Nothing where the screen did not time `best`."""
    results = screened.get("results", [])
    line = _gain_line(results, best)
    if line is None:
        return set()
    limit = line[1]
    return {key(r["config"]) for r in results
            if r["status"] in ("wrong", "failed") or (r["status"] == "timed" and r["model_us"] >= limit)}


def _gain_line(results: list[dict], best: dict) -> tuple[float, float] | None:
    """(`best`'s model time in the screen, the time a screened configuration must beat to be worth an experiment:
    that less MIN_SCREEN_GAIN_PCT); None where the screen did not time `best`."""
    anchor = next((r for r in results if r["status"] == "timed" and key(r["config"]) == key(best)), None)
    return (anchor["model_us"], anchor["model_us"] * (1 - MIN_SCREEN_GAIN_PCT / 100)) if anchor else None


def remember(memory: dict, screened: dict, best: dict) -> None:
    """A screen's figures in the agent's memory: the keys screened (never drawn again), those passed over (the
    coordinate search does not try them either), the elite the next screen mutates, the per-shape times a table is
    made from, and the queue of proposals."""
    results = screened.get("results", [])
    memory["screened"] = sorted(set(memory.get("screened", [])) | {key(r["config"]) for r in results
                                                                   if r["status"] != "unreached"})
    memory["passed_over"] = sorted(set(memory.get("passed_over", [])) | passed_over(screened, best))
    timed = sorted((r for r in results if r["status"] == "timed"), key=lambda r: r["model_us"])
    memory["elite"] = [r["config"] for r in timed[:ELITE]]
    memory["screen"] = {"shapes": screened.get("shapes", []),
                        "runs": [{"config": r["config"], "us": r["us"], "model_us": r["model_us"]} for r in timed]}
    memory["queue"] = proposals(screened, best)
    earlier = memory.get("hopeless") or {}  # from the screens of this configuration: each times other single moves
    pairs = set(map(tuple, earlier.get("pairs", []))) if earlier.get("of") == key(best) else set()
    memory["hopeless"] = {"of": key(best), "pairs": sorted(pairs | hopeless(results, best))}
    memory["screens"] = memory.get("screens", 0) + 1
    memory["screened_at"], memory["since_screen"] = key(best), 0
    memory["fruitless"] = not any(item["kind"] == "config" for item in memory["queue"])


def hopeless(results: list[dict], best: dict) -> set[tuple[str, str]]:
    """(tunable, its value as JSON) for each single move from `best` the screen timed HOPELESS_PCT slower than `best`
    or more (nothing where it did not time `best`)."""
    line = _gain_line(results, best)
    if line is None:
        return set()
    bar = line[0] * (1 + HOPELESS_PCT / 100)
    found = set()
    for r in results:
        moved = [(name, value) for name, value in r["config"].items() if best.get(name) != value]
        if r["status"] == "timed" and len(moved) == 1 and r["model_us"] >= bar:
            found.add((moved[0][0], json.dumps(moved[0][1])))
    return found


def wants_screen(memory: dict, best: dict) -> bool:
    """Whether the agent screens before its next proposal (see the module's docstring)."""
    if memory.get("queue") or memory.get("screens", 0) >= SCREEN_ROUNDS:
        return False
    return memory.get("screened_at") != key(best) or memory.get("since_screen", 0) >= SCREEN_EVERY \
        or memory.get("fruitless", False)


def summary(screened: dict, seconds: float) -> str:
    """'screen 2: 48 configurations in 37 s, 41 timed, 3 wrong, 2 failed, 2 not reached'."""
    results = screened.get("results", [])
    counts = {s: sum(r["status"] == s for r in results) for s in ("timed", "wrong", "failed", "unreached")}
    parts = [f"{counts['timed']} timed"] + [f"{counts[s]} {word}" for s, word in (
        ("wrong", "wrong"), ("failed", "failed"), ("unreached", "not reached")) if counts[s]]
    return f"{len(results)} configurations in {seconds:.0f} s, " + ", ".join(parts)
