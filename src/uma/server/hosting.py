"""The model host of a daemon: the model `uma run` names, plus the model directory's others
loaded on demand with the daemon's engine settings. Both doors (the socket and the HTTP
gateway) share the one host (uma.host), so a model loaded through either serves both."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from uma.config import ServerConfig
from uma.engine import Engine
from uma.engine.device_share import DeviceShare
from uma.host import ModelHost, Progress
from uma.model_dir import ModelFile, list_models


def host_for(engine: Engine, config: ServerConfig,
             say: Callable[[str], None] | None = None) -> tuple[ModelHost, str]:
    """A host holding `engine` (loaded by the caller, who closes it) under its listing name,
    which it returns: requests that name no model go to it. say(line): told of each load and
    unload. The host's engines take turns on the device (uma.engine.device_share): background
    work on one model runs in the time the streams of another leave it."""
    first_path = engine.config.model
    share = DeviceShare()
    engine.share_device(share)
    host: ModelHost

    def listing() -> tuple[ModelFile, ...]:
        return list_models(config.models_dir, (first_path,))

    def open_model(file: ModelFile, progress: Progress | None) -> Engine:
        # A model loaded beside others serving is read at idle priority and starts its cost
        # model from the prior (timing the device would take the cores for seconds).
        # The draft model drafts for the model it was given with: another model's vocabulary
        # is not its own, so one loaded later decodes without it.
        own = engine.config
        opened = Engine.from_config(dataclasses.replace(
            own, model=str(file.path), draft_model=None,
            speculation="off" if own.speculation == "draft" else own.speculation),
            progress=progress, beside_others=bool(host.loaded()))
        opened.share_device(share)
        return opened

    host = ModelHost(open_model, listing, max_loaded=config.max_loaded,
                     memory_cap=config.max_loaded_mb << 20,
                     keep_alive_s=None if config.keep_alive_s < 0 else config.keep_alive_s,
                     say=say)
    first = listing()[0]
    host.add(engine, first)
    return host, first.name
