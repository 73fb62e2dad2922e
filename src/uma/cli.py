"""The `uma` command line (typer)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import typer

from uma import synth

app = typer.Typer(
    help="UMA Serve: one llama.cpp model, many local apps.",
    no_args_is_help=True,
    add_completion=False,
)
model_app = typer.Typer(help="Inspect models and write synthetic ones.", no_args_is_help=True)
app.add_typer(model_app, name="model")


@app.command()
def info() -> None:
    """The backends compiled into this build and llama.cpp's view of the machine."""
    from uma import _core

    typer.echo(json.dumps({"backends": _core.backends(), "system": _core.system_info()}, indent=2))


@model_app.command("synth")
def model_synth(
    preset: str = typer.Argument("tiny", help=f"One of: {', '.join(synth.PRESETS)}"),
    output: Path | None = typer.Option(
        None, "--output", "-o", help="Where to write it (default: the model cache)"
    ),
    seed: int | None = typer.Option(None, help="Seed of the random weights"),
    dtype: str | None = typer.Option(None, help="Weight type: f32, f16 or q8_0"),
) -> None:
    """Write a synthetic GGUF model: a real architecture and tokenizer with seeded random
    weights. It runs at the speed of a real model of its shape; its text is gibberish."""
    if preset not in synth.PRESETS:
        choices = ", ".join(synth.PRESETS)
        raise typer.BadParameter(f"unknown preset {preset!r}; choose from {choices}")
    changes = {k: v for k, v in (("seed", seed), ("dtype", dtype)) if v is not None}
    try:
        spec = dataclasses.replace(synth.PRESETS[preset], **changes)
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from exc
    path = synth.write_model(output, spec) if output else synth.cached_model(spec)
    typer.echo(str(path))


@model_app.command("info")
def model_info(path: Path = typer.Argument(..., help="A GGUF file")) -> None:
    """Print a model's metadata as JSON."""
    from uma import _core
    from uma.errors import ModelLoadError

    try:
        with _core.Model(path) as model:
            typer.echo(json.dumps(model.info(), indent=2))
    except ModelLoadError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from exc


def main() -> None:
    app()


if __name__ == "__main__":
    main()
