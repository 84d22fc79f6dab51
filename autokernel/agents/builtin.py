"""The builtin agent: a seeded search over the tunables a kernel file declares. No LLM, no network.

A kernel file lists the values worth trying for each CAPS tunable in `TUNABLES` (block sizes, warps,
stages, and the kernel-specific variants: the playbook's first tier). From the best configuration so
far the agent moves one tunable at a time, nearest values first (a coordinate search; block sizes
and warp counts are smooth enough that the neighbour of a good value is the best next guess), except
that handing hard-coded values back to the kernel's own heuristics (0 or "auto") comes first, all of
them at once and then one by one, and that a tunable whose last move changed nothing (within 1%)
waits until the others have been moved. When a
move is kept, the same tunable is pushed one step further in the same direction before anything else.
When every single-tunable move from the best has been tried, pairs are tried, then triples, until
the whole space is exhausted, which ends the kernel. Configurations already tried are never repeated;
ties are broken by a seeded shuffle, so a run is reproducible.

Edits are made by rewriting the literal in the `NAME = value` line, leaving comments and the rest of
the file untouched.
"""

from __future__ import annotations

import ast
import itertools
import json
import random
from typing import NamedTuple

from autokernel.agents import Agent, Proposal, Task
from autokernel.kernelfile import declarations


class Move(NamedTuple):
    value: object
    cost: int  # steps away from the current value in the TUNABLES list
    direction: int  # +1 further along the list, -1 back, 0 unordered


def config_key(config: dict) -> str:
    return json.dumps(config, sort_keys=True)


def tunable_space(source: str) -> tuple[dict, dict]:
    """({name: values worth trying}, {name: current value}) for the tunables the file declares."""
    decl = declarations(source)
    space = {name: list(values) for name, values in (decl.get("TUNABLES") or {}).items()
             if name in decl and isinstance(values, (list, tuple)) and values}
    return space, {name: decl[name] for name in space}


AUTO_VALUES = (0, "auto", None)  # "let the kernel's own heuristic choose", by the starters' convention


def _moves(values: list, current) -> list[Move]:
    if current in values:
        i0 = values.index(current)
        # Handing a hard-coded value back to the kernel's heuristic comes first (cost 0): a starter's
        # "auto" is its author's best guess for every shape, so from a detuned file it is the big step.
        return [Move(v, 0 if _is_auto(v) and not _is_auto(current) else abs(i - i0), (i > i0) - (i < i0))
                for i, v in enumerate(values) if i != i0]
    # the current value is not in the list (a hand-edited file): nearest listed values first
    numeric = all(isinstance(v, (int, float)) for v in values + [current])
    order = sorted(values, key=lambda v: abs(v - current)) if numeric else list(values)
    return [Move(v, rank + 1, ((v > current) - (v < current)) if numeric else 0)
            for rank, v in enumerate(order)]


def _is_auto(value) -> bool:
    return value is None or (type(value) in (int, str) and value in AUTO_VALUES)


def _all_auto(space: dict, current: dict) -> dict | None:
    """Every hard-coded tunable that has an auto value handed back to the kernel's heuristics at once.

    A starter's heuristics are designed together (the warps follow the tile the variant picks), so a
    detuned file often needs several back at once, and each alone can be slower: on an H200 a looped
    rmsnorm with one warp got slower by going single-pass (still one warp) and by auto warps (still
    looped), while both together were 1.4x faster. None when fewer than two tunables are hard-coded.
    """
    auto = {name: next(v for v in values if _is_auto(v)) for name, values in space.items()
            if not _is_auto(current[name]) and any(_is_auto(v) for v in values)}
    return {**current, **auto} if len(auto) >= 2 else None


def candidates(space: dict, current: dict, seed: int, momentum: dict | None = None, flat=()):
    """Every configuration other than `current`, in the order worth trying them.

    Tunables in `flat` moved the time by less than the noise from this configuration (a block size the
    current variant does not use, say): their single moves come after every other single move.
    """
    momentum = momentum or {}
    joint = _all_auto(space, current)
    if joint is not None:
        yield joint
    moves = {name: _moves(values, current[name]) for name, values in space.items()}
    names = sorted(space)
    for changed in range(1, len(names) + 1):
        rng = random.Random(f"{seed}:{config_key(current)}:{changed}")
        level = []
        for combo in itertools.combinations(names, changed):
            for picks in itertools.product(*(moves[n] for n in combo)):
                cost = sum(p.cost for p in picks)
                onward = changed == 1 and picks[0].cost == 1 and momentum.get(combo[0]) == picks[0].direction
                inert = changed == 1 and combo[0] in flat
                level.append((inert, cost, not onward, rng.random(), combo, picks))
        level.sort(key=lambda item: item[:4])
        for *_, combo, picks in level:
            yield {**current, **{n: p.value for n, p in zip(combo, picks)}}


def _literal(value, old: str) -> str:
    if isinstance(value, str) and old.lstrip()[:1] == '"':
        return json.dumps(value)
    return repr(value)


def apply_config(source: str, config: dict) -> str:
    """The source with each `NAME = literal` line of `config` rewritten to the new value."""
    data = source.encode()
    line_starts = [0]
    for line in data.splitlines(keepends=True):
        line_starts.append(line_starts[-1] + len(line))
    spans = {}
    for node in ast.parse(source).body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            v = node.value  # ast offsets are in UTF-8 bytes
            spans[node.targets[0].id] = (line_starts[v.lineno - 1] + v.col_offset,
                                         line_starts[v.end_lineno - 1] + v.end_col_offset)
    for name in sorted(config, key=lambda n: spans[n][0], reverse=True):
        start, end = spans[name]
        new = _literal(config[name], data[start:end].decode()).encode()
        data = data[:start] + new + data[end:]
    return data.decode()


def describe_move(old: dict, new: dict) -> str:
    return ", ".join(f"{n} {old[n]!r} -> {new[n]!r}" for n in sorted(new) if new[n] != old[n])


def next_move(source: str, memory: dict, seed: int) -> Proposal | None:
    """The configuration to try next from the one in `source`, given what `memory` says was tried."""
    space, current = tunable_space(source)
    tried = {config_key(c) for c in memory.get("tried", [])} | {config_key(current)}
    for config in candidates(space, current, seed, memory.get("momentum"), memory.get("flat", ())):
        if config_key(config) not in tried:
            moves = {n: _moves(space[n], current[n]) for n in space if config[n] != current[n]}
            onward = {n: next(m.direction for m in ms if m.value == config[n]) for n, ms in moves.items()}
            return Proposal(describe_move(current, config), {"config": config, "directions": onward})
    return None


class BuiltinAgent(Agent):
    name = "builtin"

    def propose(self, task: Task) -> Proposal | None:
        source = task.kernel_file.read_text()
        move = next_move(source, task.memory, task.seed)
        if move is None:
            return None  # no TUNABLES, or every configuration has been tried
        task.kernel_file.write_text(apply_config(source, move.meta["config"]))
        return move

    def observe(self, task: Task, proposal: Proposal | None, status: str) -> None:
        if proposal is None:  # the baseline: its configuration counts as tried
            config = tunable_space(task.kernel_file.read_text())[1]
        else:
            config = proposal.meta.get("config")
        if not config:
            return
        task.memory.setdefault("tried", []).append(config)
        if status == "keep" and proposal is not None:
            task.memory["momentum"] = proposal.meta.get("directions", {})
            task.memory["flat"] = []  # under the new configuration every tunable may matter again
        elif status == "revert" and proposal is not None and _made_no_difference(task.history):
            flat = task.memory.setdefault("flat", [])
            flat.extend(n for n in proposal.meta.get("directions", {}) if n not in flat)


FLAT_PCT = 1.0  # a revert this close to the best says the moved tunable does not matter here


def _made_no_difference(history: list[dict]) -> bool:
    """Whether the last experiment timed within FLAT_PCT of the best kept (or baseline) before it."""
    try:
        last = float(history[-1]["latency_us"])
        best = min(float(r["latency_us"]) for r in history[:-1] if r["status"] in ("baseline", "keep"))
    except (ValueError, KeyError, IndexError):
        return False  # a crash, a timeout, no baseline yet: nothing learnt about sensitivity
    return abs(last - best) <= FLAT_PCT / 100 * best
