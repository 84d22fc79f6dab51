"""Command-line pieces that the five scripts share (kept free of torch so that --help is instant).

The conventions, written once here:
  - an error is one line on stderr, `<script>: error: <what>`; --debug shows the full traceback instead;
  - exit code 2 when the script could not do its job (bad arguments, a missing file, an unknown kernel
    type or dtype, a GPU asked for where there is none); 1 only where a script ran and its result is a
    failure (bench.py: an incorrect kernel; verify.py: a correctness FAIL; extract.py: a missing starter);
  - arguments are checked before anything is written (kernel_types, check_limits): bad input leaves every
    file as it was and adds no results.tsv row;
  - --device auto | cpu | cuda (auto: cuda when a GPU is visible), dtypes spelled fp16 | bf16 | fp32;
  - every option's default is shown in --help.
"""

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

EXIT_FAILURE = 1  # the script ran and its verdict is a failure
EXIT_ERROR = 2  # the script could not run: bad input, as argparse's own errors
DEVICE_CHOICES = ("auto", "cpu", "cuda")
DEPLOY_MODES = ("eager", "graph", "compile", "compile_graph")  # how a user runs the model; the prune's yardstick
DTYPE_ALIASES = {"fp16": "fp16", "float16": "fp16", "half": "fp16", "bf16": "bf16", "bfloat16": "bf16",
                 "fp32": "fp32", "float32": "fp32", "float": "fp32"}  # autokernel.registry.parse_dtype's table
DTYPE_HELP = "fp16 | bf16 | fp32 (float16, bfloat16, float32 also accepted)"
DEVICE_HELP = "auto: cuda when a GPU is visible, else cpu (Triton's interpreter: timings are not figures)"


class UsageError(Exception):
    """Bad input found by a script itself: one line, exit code 2."""


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Keeps the docstring epilogs as written and appends `(default: X)` to an option's help that does
    not state its default itself."""

    def _get_help_string(self, action):
        text = action.help or ""
        if text is argparse.SUPPRESS or "default" in text or "%(default)" in text:
            return text
        if any(action.default is v for v in (None, False, argparse.SUPPRESS)) or action.default == "":
            return text
        return f"{text} (default: %(default)s)"


class Parser(argparse.ArgumentParser):
    """argparse with the shared formatter and a one-line error (no usage block), exit code 2."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message):
        self.exit(EXIT_ERROR, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def add_debug_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--debug", action="store_true", help="show the full traceback on errors")


def add_device_argument(parser: argparse.ArgumentParser, help: str = DEVICE_HELP) -> None:
    parser.add_argument("--device", choices=DEVICE_CHOICES, default="auto", help=f"{help} (default auto)")


def settings(text: str) -> dict:
    """'NAME=VALUE[,NAME=VALUE]' (each VALUE a Python literal) -> {NAME: VALUE}: module constants a developer
    script sets in a kernel file (scripts/sweep_tunables.py --compare, scripts/launch_overhead.py --set)."""
    import ast

    return {name: ast.literal_eval(value) for name, _, value in (kv.partition("=") for kv in text.split(","))}


def dtype_name(name: str) -> str:
    """fp16, bf16 or fp32 for any accepted spelling; UsageError otherwise (torch-free, so checked early)."""
    try:
        return DTYPE_ALIASES[name.lower()]
    except KeyError:
        raise UsageError(f"unknown dtype {name!r}; use one of fp16, bf16, fp32") from None


def check_model_arguments(args) -> None:
    """What profile.py and verify.py can reject before importing torch: an unknown dtype, a missing file."""
    dtype_name(args.dtype)
    if args.model and not Path(args.model).is_file():
        raise UsageError(f"model file not found: {args.model}")


def kernel_types(text: str, known, option: str = "--types") -> list[str]:
    """'a,b' -> [a, b], each once, in the order given; UsageError naming each unknown type once (and the known
    ones) where `known` (the registry's types, or those a script can plug in) lacks one."""
    found = list(dict.fromkeys(t.strip() for t in text.split(",") if t.strip()))
    unknown = [t for t in found if t not in known]
    if unknown:
        raise UsageError(f"{option}: unknown kernel type(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")
    return found


def check_limits(args, positive: tuple[str, ...] = (), non_negative: tuple[str, ...] = ()) -> None:
    """UsageError for the first of args' numeric options out of its range: each of `positive` more than 0, each
    of `non_negative` at least 0 (an option left at None is not given, and fine). Checked before a script writes
    anything."""
    for names, strict in ((positive, True), (non_negative, False)):
        for name in names:
            value = getattr(args, name, None)
            if value is not None and (value <= 0 if strict else value < 0):
                raise UsageError(f"--{name.replace('_', '-')} must be {'more than' if strict else 'at least'} 0, "
                                 f"got {value:g}")


def check_output_files(**paths) -> None:
    """UsageError when an output file (option name -> path, None: not asked for) could not be written: its
    directory is missing, or it is a directory. Checked before the work, whose result it would hold."""
    for option, path in paths.items():
        if path is None:
            continue
        flag = f"--{option.replace('_', '-')} {path}"
        if Path(path).is_dir():
            raise UsageError(f"{flag}: is a directory, not a file")
        if not Path(path).resolve().parent.is_dir():
            raise UsageError(f"{flag}: no such directory {Path(path).parent}")


def error_text(e: BaseException, known: tuple[str, ...] = ()) -> str:
    """The first line of an error; an exception type the script does not expect is named, with a hint."""
    message = str(e.args[0]) if isinstance(e, KeyError) and e.args else str(e)  # KeyError's str() is a repr
    text = message.strip().splitlines()[0] if message.strip() else type(e).__name__
    if isinstance(e, UsageError) or type(e).__name__ in known:
        return text
    return f"{type(e).__name__}: {text} (--debug shows where)"


def run_main(prog: str, body: Callable[[], int], debug: bool, explain: Callable[[Exception], str] | None = None,
             known: tuple[str, ...] = ()) -> int:
    """body()'s exit code; an exception becomes `<prog>: error: <one line>` and exit code 2, or with
    --debug its traceback."""
    try:
        return body()
    except Exception as e:
        if debug:
            raise
        print(f"{prog}: error: {explain(e) if explain else error_text(e, known)}", file=sys.stderr)
        return EXIT_ERROR


def add_model_arguments(parser: argparse.ArgumentParser, presets: str = "tiny, compact, 7b, ...",
                        source_title: str = "the model (a file and class, or a package)"):
    """The options that name a model and how to run it (profile.py, verify.py). Returns the second group."""
    src = parser.add_argument_group(source_title)
    src.add_argument("--model", metavar="FILE", help="Python file defining the model, e.g. models/llama.py")
    src.add_argument("--module", metavar="PACKAGE", help="import the class from a package, e.g. transformers")
    src.add_argument("--class-name", required=True, help="the model class, e.g. LlamaModel")
    src.add_argument("--config", help=f"preset passed to the class ({presets}), or for transformers a model "
                                      "name or local directory")
    src.add_argument("--pretrained", action="store_true",
                     help="transformers: load weights from the local cache instead of random ones")
    how = parser.add_argument_group("how to run it")
    how.add_argument("--input-shape", default="1,512", help="input shape, batch,seq for token models (default 1,512)")
    how.add_argument("--dtype", default="fp16", help=f"{DTYPE_HELP} (default fp16)")
    add_device_argument(how)
    return how
