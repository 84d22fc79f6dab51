"""Command-line pieces that more than one script shares (kept free of torch so that --help is instant)."""

import argparse


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
    how.add_argument("--dtype", default="float16", help="float16 | bfloat16 | float32 (default float16)")
    how.add_argument("--device", choices=["cuda", "cpu"], help="default: cuda when a GPU is visible")
    return how
