"""The models the HTTP listings offer beside the loaded ones, and the answer to a request that
names a model this daemon cannot serve. Protocol only: the gateway reads the listing
(uma.model_dir) off its event loop and hands it here.

A request names a model by its listing name (Ollama's dialect adds the tag `:latest`). One
that is available but not loaded is loaded for it (uma.host); one that is nowhere, or whose
file cannot be served, is answered 404, naming what there is.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from uma.errors import shown
from uma.model_dir import ModelFile
from uma.server.openai_api import ApiError

NAMED = 5  # models a "not found" message names before "and N more": it stays short


def others(listing: Sequence[ModelFile], loaded: str | os.PathLike[str]
           ) -> tuple[ModelFile, ...]:
    """The listing without the loaded file (it is listed under the names it is served by)."""
    path = Path(loaded).expanduser()
    return tuple(m for m in listing if m.path != path)


def find(listing: Sequence[ModelFile], model: str) -> ModelFile | None:
    """The entry a request's model names: its name, with or without the tag `:latest`."""
    name = model.removesuffix(":latest")
    return next((m for m in listing if m.name == name), None)


def not_served(model: str, loaded: Sequence[str], listing: Sequence[ModelFile],
               tag: str = "") -> ApiError:
    """The answer to a request for `model`, which is neither loaded nor a model of the
    listing that can be: 404 naming the models there are (`loaded`: the loaded ones' names;
    `tag` is what the request's dialect adds to a listing name)."""
    found = find(listing, model)
    if found is not None and found.error is not None:
        return ApiError(404, f"model {shown(model)} cannot be served: {found.error}",
                        param="model", code="model_not_found")
    names = [f"{(name + tag)!r} (loaded)" for name in loaded]
    usable = [m for m in listing if m.usable and m.name not in loaded]
    names += [repr(m.name + tag) for m in usable[:NAMED]]
    more = f" and {len(usable) - NAMED} more" if len(usable) > NAMED else ""
    return ApiError(404, f"model {shown(model)} not found; this server has "
                         f"{', '.join(names) or 'no model'}{more}", param="model",
                    code="model_not_found")


def openai_model(model_id: str, created: float, loaded: bool, *, architecture: str | None,
                 quantization: str | None, n_ctx_train: int | None, n_params: int | None,
                 size: int) -> dict[str, Any]:
    """An entry of /v1/models: OpenAI's four fields, whether it is the loaded model, and its
    facts under `meta` (the names llama-server's listing uses where it has them)."""
    return {"id": model_id, "object": "model", "created": int(created), "owned_by": "uma",
            "loaded": loaded,
            "meta": {"architecture": architecture, "quantization": quantization,
                     "n_ctx_train": n_ctx_train, "n_params": n_params, "size": size}}


def openai_listed(m: ModelFile) -> dict[str, Any]:
    """A model of the listing that is not loaded, as /v1/models lists it."""
    return openai_model(m.name, m.modified, False, architecture=m.architecture,
                        quantization=m.quantization, n_ctx_train=m.context_length,
                        n_params=m.n_params, size=m.size)
