"""The builtin agent: a seeded search over the tunables a kernel file declares. No LLM, no network.

Where the loop offers a screen (Task.screen: the harness times many configurations at the model's shapes in one
process), the agent first screens configurations drawn from the whole space and proposes what ranks above the
kernel as it is, then a per-shape table (search.py says when it screens again). What follows is the coordinate
search it goes on with between screens, and alone where there is no screen.

A kernel file lists the values worth trying for each CAPS tunable in `TUNABLES` (block sizes, warps,
stages, and the kernel-specific variants: the playbook's first tier). From the best configuration so
far the agent moves one tunable at a time, nearest values first (a coordinate search; block sizes
and warp counts are smooth enough that the neighbour of a good value is the best next guess), except
that handing hard-coded values back to the kernel's own heuristics (0 or "auto") comes first, all of
them at once and then one by one, and that a tunable whose last move changed nothing (within 1%)
waits until the others have been moved, and one whose move changed not even what the kernel launches (the
harness's launch record: a tunable of a variant these shapes do not run) is not moved again, alone or with
others, until a keep changes the configuration. When a
move is kept, the same tunable is pushed one step further in the same direction before anything else.
When every single-tunable move from the best has been tried, pairs are tried, then triples, until
the whole space is exhausted, which ends the kernel. Configurations already tried are never repeated, nor those
a screen passed over (timed there no faster than the configuration it screened from, or wrong or failed there);
ties are broken by a seeded shuffle, so a run is reproducible.

Edits are made by rewriting the literal in the `NAME = value` line, leaving comments and the rest of
the file untouched.

Shape specialization. A kernel the model calls at several shapes is timed at each (modeltime.py), and
the agent remembers every tried configuration's time per shape. When the loop ends the kernel, the
agent's last move (finish) is a per-shape table when some shape was fastest, by more than
TABLE_MIN_GAIN_PCT, under another configuration than the best single one: `SHAPE_CONFIGS` maps the
tensor arguments' shapes to that configuration, and a new `kernel_fn` (same signature) sets those
tunables for the call and hands over to the single-configuration one. The loop keeps the table only
if the model's time with it beats the best single configuration, like any other change. A table holds for the
dtype the model runs in (Task.dtype): the harness's checks in other dtypes run the constants.

A screened configuration is timed at the model's shapes only; the five stages then run it at every shape and dtype
they check. Where it crashed there on a limit of the hardware (a shared-memory budget four fp32 stages exceed, say),
or ran past the time limit compiling for them all, the agent proposes it again at once as a table of the model's
shapes alone, where the screen ran it and timed it faster, the constants everywhere else. Once such a table is kept,
the search goes on from its configuration (Position): the screens time configurations at the model's shapes on the
file without the table, and every proposal is a table of the model's shapes again, since the constants no longer
act there.
"""

from __future__ import annotations

import ast
import itertools
import json
import math
import random
import textwrap
import time
from typing import NamedTuple

from autokernel.kernelfile import apply_config, declarations, tunable_space
from autokernel.loop.agents import Agent, Proposal, Task, search
from autokernel.results import objective_us


class Move(NamedTuple):
    value: object
    cost: int  # steps away from the current value in the TUNABLES list
    direction: int  # +1 further along the list, -1 back, 0 unordered


config_key = search.key


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
    detuned file often needs several back at once, and each alone can be slower: a looped rmsnorm with one
    warp got slower by going single-pass (still one warp) and by auto warps (still looped), while both together
    were faster. None when fewer than two tunables are hard-coded.
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


def describe_move(old: dict, new: dict) -> str:
    return ", ".join(f"{n} {old[n]!r} -> {new[n]!r}" for n in sorted(new) if new[n] != old[n])


def next_move(pos: Position, memory: dict, seed: int) -> Proposal | None:
    """The configuration to try next from where `pos` stands, given what `memory` says was tried (and what a screen
    passed over, search.passed_over; no move to a value the screens found hopeless, search.hopeless)."""
    space, current = pos.space, pos.best
    tried = {config_key(c) for c in memory.get("tried", [])} | {config_key(current)}
    tried |= set(memory.get("passed_over", ()))
    inert = set(memory.get("inert", ()))
    space = {n: values for n, values in space.items() if n not in inert}
    screened = memory.get("hopeless") or {}  # single moves from here a screen timed far behind
    here = screened.get("of") == config_key(current)
    hopeless = {tuple(pair) for pair in screened.get("pairs", ())} if here else set()
    for config in candidates(space, current, seed, memory.get("momentum"), memory.get("flat", ())):
        if config_key(config) not in tried and not any(
                (n, json.dumps(v)) in hopeless for n, v in config.items() if v != current[n]):
            moves = {n: _moves(space[n], current[n]) for n in space if config[n] != current[n]}
            onward = {n: next(m.direction for m in ms if m.value == config[n]) for n, ms in moves.items()}
            return Proposal(describe_move(current, config), {"config": config, "directions": onward})
    return None


def describe_next(source: str, memory: dict, seed: int) -> str:
    """What the agent does next in a loop that offers a screen (orchestrate.py next), in one line."""
    pos = position(source, model_shape_keys(memory))
    if pos.space and search.wants_screen(memory, pos.best):
        return f"screen up to {search.SCREEN_SIZE} configurations drawn from the whole space, then try the fastest"
    queued = next((item for item in memory.get("queue", []) if item["kind"] == "table" or
                   config_key(item["config"]) != config_key(pos.best)), None)
    if queued is not None:
        what = "a per-shape table" if queued["kind"] == "table" else describe_move(pos.best, queued["config"])
        what += " at the model's shapes alone" if queued["kind"] == "model_shapes" else ""
        return f"{what} (from {memory.get('screen_note', 'the last screen')})"
    move = next_move(pos, memory, seed)
    return move.description if move else "none left (space exhausted)"


# ------------------------------------------------------------------------------ shape specialization
TABLE_MIN_GAIN_PCT = 2.0  # a shape joins the table only when another configuration was this much faster there
TABLE_MARK = "# --- per-shape configurations (builtin agent)"
TORCH_DTYPES = {"fp16": "float16", "bf16": "bfloat16", "fp32": "float32"}  # the loop's names (no torch import here)


def record_shape_times(memory: dict, config: dict, model_shapes: list[dict]) -> None:
    """Remember a timed configuration's time per model shape (keyed by the arguments' shapes)."""
    if not model_shapes:
        return
    memory["shapes"] = [{"key": s["arg_shapes"], "calls": s["calls"]} for s in model_shapes]
    memory.setdefault("shape_us", []).append({"config": config, "us": [s["us"] for s in model_shapes]})


def shape_table(memory: dict, best: dict) -> dict | None:
    """{shape key (json): configuration} for the shapes where another configuration than `best` was
    fastest by more than TABLE_MIN_GAIN_PCT, when the table's predicted time in the model beats best's;
    else None. Needs two or more model shapes (one shape has one best configuration)."""
    return table_from(memory.get("shapes") or [], memory.get("shape_us") or [], best)


def table_from(shapes: list[dict], runs: list[dict], best: dict) -> dict | None:
    """shape_table() from the shapes ({"key", "calls"}) and the timed configurations ({"config", "us": per shape})
    of the loop's experiments or of a screen."""
    mine = next((r["us"] for r in reversed(runs) if config_key(r["config"]) == config_key(best)), None)
    if len(shapes) < 2 or mine is None or len(mine) != len(shapes):
        return None
    table, predicted = {}, list(mine)
    for i, shape in enumerate(shapes):
        fastest = min((r for r in runs if len(r["us"]) == len(shapes)), key=lambda r: r["us"][i])
        if fastest["us"][i] < mine[i] * (1 - TABLE_MIN_GAIN_PCT / 100):
            table[json.dumps(shape["key"])] = fastest["config"]
            predicted[i] = fastest["us"][i]
    calls = [s["calls"] for s in shapes]
    if not table or sum(c * t for c, t in zip(calls, predicted)) >= sum(c * t for c, t in zip(calls, mine)):
        return None
    return table


def launch_key(arg_shapes: list[list[int]]) -> tuple:
    """How the dispatching kernel_fn recognises a shape: (elements, last dimension) of each tensor argument,
    so that a model passing (1, 2048, 768) where the harness timed (2048, 768) still finds its entry."""
    return tuple((math.prod(shape), shape[-1] if shape else 1) for shape in arg_shapes)


def apply_table(source: str, table: dict, best: dict, dtype: str | None = None) -> str | None:
    """The source ending with the per-shape table and its dispatching kernel_fn, the table for calls whose first
    tensor is of `dtype` alone where one is given ("fp16"); None when the file's kernel_fn cannot be wrapped (no
    torch import, *args or keyword-only parameters); the source as it is where no entry differs from `best`."""
    found = _kernel_fn_header(source)
    if found is None:
        return None
    fn, header = found
    params = ", ".join(a.arg for a in fn.args.posonlyargs + fn.args.args)
    names = sorted({n for config in table.values() for n in config if config[n] != best.get(n)})
    if not names:
        return source
    entries = "".join(f"    {launch_key(json.loads(key))!r}: {tuple(config[n] for n in names)!r},\n"
                      for key, config in table.items())
    saved = ", ".join(f"_saved_{i}" for i in range(len(names)))
    only = f"torch.{TORCH_DTYPES.get(dtype, dtype)}" if dtype else "None"
    block = textwrap.dedent(f"""


        {TABLE_MARK} ---------------------------------------------------
        # The model calls this kernel at several shapes and some were fastest under another configuration
        # than the constants above: at launch the tensor arguments' sizes pick it (other shapes keep them).
        SHAPE_TABLE_NAMES = {tuple(names)!r}
        SHAPE_TABLE_DTYPE = {only}  # the dtype the table was timed in (None: any); others keep the constants
        SHAPE_CONFIGS = {{
        {{entries}}}}
        _single_config_kernel_fn = kernel_fn


        def _with_config(config, args):
            global {", ".join(names)}
            {saved}, = {", ".join(names)},
            {", ".join(names)}, = config
            try:
                return _single_config_kernel_fn(*args)
            finally:
                {", ".join(names)}, = {saved},


        {{header}}
            args = ({params},)
            tensors = [a for a in args if isinstance(a, torch.Tensor)]
            key = tuple((a.numel(), a.shape[-1] if a.dim() else 1) for a in tensors)
            mine = SHAPE_TABLE_DTYPE is None or tensors[0].dtype == SHAPE_TABLE_DTYPE
            config = SHAPE_CONFIGS.get(key) if mine else None
            return _single_config_kernel_fn(*args) if config is None else _with_config(config, args)
        """)
    block = block.replace("{entries}", entries).replace("{header}", header.strip())
    return source.rstrip() + "\n\n\n" + block.strip("\n") + "\n"


def _kernel_fn_header(source: str) -> tuple[ast.FunctionDef, str] | None:
    """kernel_fn's node and its `def` line(s), where apply_table can wrap it (see there), else None."""
    fn = next((n for n in ast.parse(source).body if isinstance(n, ast.FunctionDef) and n.name == "kernel_fn"), None)
    if fn is None or "import torch" not in source or TABLE_MARK in source or fn.args.vararg or fn.args.kwarg \
            or fn.args.kwonlyargs or fn.body[0].lineno == fn.lineno:
        return None
    lines = source.splitlines(keepends=True)
    header = "".join(lines[fn.lineno - 1:fn.body[0].lineno - 1]).rstrip()
    return (fn, header) if header.endswith(":") else None  # not: a comment after the colon, a docstring on the line


# ------------------------------------------------------------------------------ where the search stands
class Position(NamedTuple):
    """Where the search stands in a kernel file: its tunables, the configuration the model's shapes run (`best`: the
    file's constants, or the configuration of a table that holds at every model shape), and the file to write a
    configuration into (`base`: the file, or the file without that table, whose constants run at the other shapes)."""
    space: dict
    best: dict
    constants: dict
    base: str
    at_model: list[str] | None  # the model's shapes (json keys) a table holds `best` at, or None: no such table


def model_shape_keys(memory: dict) -> list[str]:
    """The model's shapes (json of the arguments' shapes) as the agent's memory knows them, [] before any timing."""
    shapes = memory.get("shapes") or memory.get("screen", {}).get("shapes") or []
    return [json.dumps(s["key"]) for s in shapes]


def position(source: str, shape_keys: list[str]) -> Position:
    """The search's position in `source` (see Position). A table the agent wrote for the model's shapes alone (a
    configuration the stages' other shapes could not run) is where the search goes on: its configuration is what
    the model runs, and each later proposal is such a table too (the file's constants would not act at those shapes)."""
    at_model = _table_at_model(source, shape_keys) if TABLE_MARK in source else None
    base = source[:source.index(TABLE_MARK)].rstrip() + "\n" if at_model is not None else source
    space, constants = tunable_space(base)
    if at_model is None:
        return Position(space, constants, constants, source, None)
    return Position(space, {**constants, **at_model}, constants, base, shape_keys)


def _table_at_model(source: str, shape_keys: list[str]) -> dict | None:
    """The tunables a per-shape table sets where it holds one configuration at exactly the model's shapes, else None."""
    decl = declarations(source)
    names, configs = decl.get("SHAPE_TABLE_NAMES"), decl.get("SHAPE_CONFIGS")
    if not shape_keys or not isinstance(configs, dict) or len(set(configs.values())) != 1 \
            or set(configs) != {launch_key(json.loads(k)) for k in shape_keys}:
        return None
    return dict(zip(names, next(iter(configs.values()))))


def written(pos: Position, config: dict, dtype: str) -> str:
    """The file with `config` where the model's shapes run it: its constants, or the table of those shapes."""
    if pos.at_model is None or config == pos.constants:
        return apply_config(pos.base, config)
    return written_table(pos, {key: config for key in pos.at_model}, dtype) or apply_config(pos.base, config)


def written_table(pos: Position, table: dict, dtype: str) -> str | None:
    """The file with a per-shape `table` (apply_table), the model's other shapes at `best`; None where the file's
    kernel_fn cannot be wrapped."""
    if pos.at_model is None:
        return apply_table(pos.base, table, pos.best, dtype)
    return apply_table(pos.base, {**{key: pos.best for key in pos.at_model}, **table}, pos.constants, dtype)


class BuiltinAgent(Agent):
    name = "builtin"

    def finish(self, task: Task) -> Proposal | None:
        """The per-shape table, when the shapes disagree on their best configuration (see the docstring)."""
        pos = self._position(task)
        return self._table(task, pos, shape_table(task.memory, pos.best), "per-shape table")

    @staticmethod
    def _position(task: Task) -> Position:
        return position(task.kernel_file.read_text(), model_shape_keys(task.memory))

    def _table(self, task: Task, pos: Position, table: dict | None, what: str, config=None) -> Proposal | None:
        new = written_table(pos, table, task.dtype) if table else None
        if new is None:
            return None
        task.kernel_file.write_text(new)
        picks = "; ".join(f"{key}: {describe_move(pos.best, c) or 'as above'}" for key, c in table.items())
        return Proposal(f"{what} ({picks})", {"table": table, **({"config": config} if config else {})})

    def propose(self, task: Task) -> Proposal | None:
        pos = self._position(task)
        if pos.space and task.screen is not None and search.wants_screen(task.memory, pos.best):
            self._screen(task, pos)
        while task.memory.get("queue"):
            proposal = self._queued(task, pos, task.memory["queue"].pop(0))
            if proposal is not None:
                return proposal
        move = next_move(pos, task.memory, task.seed)
        if move is None:
            return None  # no TUNABLES, or every configuration has been tried
        task.memory["since_screen"] = task.memory.get("since_screen", 0) + 1
        task.kernel_file.write_text(written(pos, move.meta["config"], task.dtype))
        return move

    def _screen(self, task: Task, pos: Position) -> None:
        """Screen configurations drawn from the whole space (search.py); the figures go to the agent's memory and
        to workspace/agent_logs/. A screen that fails turns screening off for this kernel, and so does a space with
        nothing left to draw. The screen applies each configuration to the file without a table of the model's
        shapes (it times those shapes alone), and the file is as it was after it."""
        memory = task.memory
        seen = set(memory.get("screened", [])) | {config_key(c) for c in memory.get("tried", [])}
        configs = search.draw(pos.space, pos.best, task.seed + memory.get("screens", 0), seen,
                              elite=memory.get("elite"))
        if len(configs) < 2:  # nothing but the configuration it has
            memory["screens"] = search.SCREEN_ROUNDS
            return
        started, source = time.monotonic(), task.kernel_file.read_text()
        try:
            if pos.base != source:  # a table of the model's shapes: the screen times the file without it
                task.kernel_file.write_text(pos.base)
            screened = task.screen(configs)
        except Exception as e:  # noqa: BLE001  (the coordinate search goes on without it)
            memory["screens"], memory["screen_error"] = search.SCREEN_ROUNDS, str(e)[:300]
            return
        finally:
            if pos.base != source:
                task.kernel_file.write_text(source)
        search.remember(memory, screened, pos.best)
        memory["screen_note"] = f"screen {memory['screens']}: {search.summary(screened, time.monotonic() - started)}"
        task.log_dir.mkdir(parents=True, exist_ok=True)
        log = task.log_dir / f"{task.kernel_name}_screen_{memory['screens']}.json"
        log.write_text(json.dumps(screened, indent=1))

    def _queued(self, task: Task, pos: Position, item: dict) -> Proposal | None:
        """The proposal a queued screen result makes from the file as it is now, or None when it has none left
        (a configuration tried since, a table the shapes do not call for)."""
        note = task.memory.get("screen_note", "screen")
        if item["kind"] == "table":
            screen = task.memory.get("screen", {})
            table = table_from(screen.get("shapes", []), screen.get("runs", []), pos.best)
            return self._table(task, pos, table, f"per-shape table from {note}")
        if item["kind"] == "model_shapes":  # a screened configuration the stages' other shapes could not run
            shapes = task.memory.get("screen", {}).get("shapes", [])
            table = {json.dumps(shape["key"]): item["config"] for shape in shapes}
            return self._table(task, pos, table, f"the model's shapes alone ({item['why']})", item["config"])
        config = item["config"]
        tried = {config_key(c) for c in task.memory.get("tried", [])}
        if config_key(config) in tried or config_key(config) == config_key(pos.best) or set(config) != set(pos.best):
            return None
        task.kernel_file.write_text(written(pos, config, task.dtype))
        gain = 100 * (item["anchor_us"] - item["screen_us"]) / item["anchor_us"]
        return Proposal(f"{describe_move(pos.best, config)} (from {note}: {gain:.1f}% faster there)",
                        {"config": config, "directions": {}, "screened": pos.at_model is None,
                         "screen_us": item["screen_us"]})

    def observe(self, task: Task, proposal: Proposal | None, status: str) -> None:
        if proposal is None:  # the baseline: its configuration counts as tried
            config = self._position(task).best
        else:
            config = proposal.meta.get("config")
        if not config:
            return
        task.memory.setdefault("tried", []).append(config)
        record_shape_times(task.memory, config, task.model_shapes)
        # timed at the model's shapes by the screen, it failed at another: those shapes alone, next
        why = _failed_elsewhere(task.history, status) if proposal and proposal.meta.get("screened") else None
        if why:
            task.memory.setdefault("queue", []).insert(0, {"kind": "model_shapes", "config": config, "why": why})
        if status == "keep" and proposal is not None:
            task.memory["momentum"] = proposal.meta.get("directions", {})
            if proposal.meta.get("screen_us"):  # the screen's slower configurations cannot beat it now
                search.outdone(task.memory, config, proposal.meta["screen_us"])
            # under the new configuration every tunable may matter again
            task.memory["flat"], task.memory["inert"] = [], []
        elif status == "unchanged" and proposal is not None and len(proposal.meta.get("directions", {})) == 1:
            inert = task.memory.setdefault("inert", [])
            inert.extend(n for n in proposal.meta["directions"] if n not in inert)
        elif status == "revert" and proposal is not None and _made_no_difference(task.history):
            flat = task.memory.setdefault("flat", [])
            flat.extend(n for n in proposal.meta.get("directions", {}) if n not in flat)


FLAT_PCT = 1.0  # a revert this close to the best says the moved tunable does not matter here
# what a crash row says when a launch asked for more than the hardware has (autokernel/harness/crash.py's words)
HARDWARE_LIMITS = ("shared memory asked", "OutOfResources")


def _failed_elsewhere(history: list[dict], status: str) -> str | None:
    """Why the last experiment failed where the screen, which timed it at the model's shapes, did not run it: a
    crash on a limit of the hardware ("B=1 ... fp32: kernel_fn ran out of memory on the GPU (triton.OutOfResources):
    246,016 bytes of shared memory asked, ...": where and why), or a timeout (the stages compile it for every shape
    and dtype they check; an H100 night lost flash_attention's 7.5% so); else None."""
    text = (history[-1].get("description") or "") if history else ""
    if status == "timeout":
        return "no result within the time limit at the stages' shapes and dtypes"
    if status != "crash" or not any(mark in text for mark in HARDWARE_LIMITS):
        return None
    at = text.rfind("(", 0, text.find(": kernel_fn"))
    return text[at + 1:].rstrip(")") if at >= 0 else "a hardware limit"


def _made_no_difference(history: list[dict]) -> bool:
    """Whether the last experiment timed within FLAT_PCT of the best kept (or baseline) before it."""
    try:
        last = objective_us(history[-1])
        best = min(objective_us(r) for r in history[:-1] if r["status"] in ("baseline", "keep"))
    except (ValueError, KeyError, IndexError, TypeError):
        return False  # a crash, a timeout, no baseline yet: nothing learnt about sensitivity
    if last is None:
        return False
    return abs(last - best) <= FLAT_PCT / 100 * best
