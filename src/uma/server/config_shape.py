"""The config file's nested shape: one table from each dotted path to the flat setting it sets,
and the translation of a file's nested sections into flat settings (and back, for
`uma config --nested`).

The design brief (seed 004, "Runtime config (YAML)") writes the daemon's config in sections::

    latency_cap: 1.20
    bmt_budget_gbps: 320
    qos:
      interactive: {priority: 10}
      background:  {priority: 1}
    scheduler:
      max_merge: 4
      preempt_at_token: true

while the first config files were flat TOML, keyed by the settings' own names (`ctx = 4096`).
Both are read, even mixed in one file; a setting given twice, once in each shape, is refused.
NESTED is the single source: loading, `uma config --nested` and docs/guide/configuration.md's
mapping table follow it, and tests/server/test_config_shape.py holds every setting to exactly one
path.
Pure: no I/O, so the file formats (config_file) and the settings (settings) both use it.
"""

from __future__ import annotations

import difflib
from collections.abc import Collection, Mapping
from typing import Any

from uma.errors import InvalidRequestError
from uma.knobs import KNOBS

# dotted path -> flat setting, grouped as `uma run --help` groups the flags (cli.PANELS)
NESTED: dict[str, str] = {
    # the brief's own keys, at the top as it writes them
    "latency_cap": "latency_cap",
    "bmt_budget_gbps": "bmt_budget",  # GB/s, as bmt_budget (which also takes "320GBps")
    # Model and device
    "model.path": "model",
    "model.models_dir": "models_dir",
    "model.max_loaded": "max_loaded",
    "model.keep_alive": "keep_alive",
    "model.max_loaded_mb": "max_loaded_mb",
    "model.threads": "threads",
    "model.threads_batch": "threads_batch",
    "model.gpu_layers": "gpu_layers",
    "model.experts_used": "experts_used",
    "model.flash_attn": "flash_attn",
    "model.device_sampling": "device_sampling",
    "model.overlap": "overlap",
    "model.batch": "batch",
    "model.ubatch": "ubatch",
    "model.chat_template": "chat_template",
    "model.embedding_ctx": "embedding_ctx",
    "model.pooling": "pooling",
    "model.draft_model": "draft_model",
    "model.rpc": "rpc",
    "model.tensor_split": "tensor_split",
    # KV cache and prefix cache
    "kv.ctx": "ctx",
    "kv.type": "kv_type",
    "kv.type_k": "type_k",
    "kv.type_v": "type_v",
    "kv.unified": "kv_unified",
    "kv.prefix_cache": "prefix_cache",
    "kv.prefix_cache_tokens": "prefix_cache_tokens",
    "kv.prefix_cache_ram_mb": "prefix_cache_ram_mb",
    "kv.prefix_cache_disk_mb": "prefix_cache_disk_mb",
    "kv.prefix_cache_dir": "prefix_cache_dir",
    # Scheduling. The brief's max_merge is how many requests' tokens one decode coalesces
    # ("token-level coalescing (2-8)"): here every running request decodes a token each tick,
    # so that bound is `parallel`, the requests decoded at once (more wait in the queue).
    "scheduler.max_merge": "parallel",
    # background requests give their sequences to interactive ones at a token boundary
    "scheduler.preempt_at_token": "preempt_at_token",
    "scheduler.policy": "policy",
    "scheduler.tick_ms": "tick_ms",
    "scheduler.tick_budget_ms": "tick_budget_ms",
    "scheduler.max_queue": "max_queue",
    "scheduler.background_ctx": "background_ctx",
    "scheduler.background_seqs": "background_seqs",
    "scheduler.speculation": "speculation",
    # the bound policy's knobs: the [slo] table the flat files already had (uma.knobs)
    **{f"slo.{knob.name}": knob.name for knob in KNOBS},
    # Apps
    "apps.fair_share": "fair_share",
    "apps.weights": "app_weights",
    "apps.fair_quantum_ms": "fair_quantum_ms",
    "apps.latency_caps": "app_latency_caps",
    # Requests and socket
    "requests.max_tokens": "max_tokens",
    "requests.default_max_tokens": "default_max_tokens",
    "requests.max_prompt_bytes": "max_prompt_bytes",
    "requests.grace": "grace",
    "socket.path": "socket",
    "socket.max_connections": "max_connections",
    "socket.max_inflight": "max_inflight",
    "socket.idle_timeout": "idle_timeout",
    "socket.max_frame_bytes": "max_frame_bytes",
    "socket.max_input_bytes": "max_input_bytes",
    "socket.frame_timeout": "frame_timeout",
    "socket.max_outbuf_bytes": "max_outbuf_bytes",
    # HTTP
    "http.address": "http",
    "http.api_key": "api_key",
    "http.api_key_file": "api_key_file",
    "http.allow_public": "allow_public",
    "http.max_connections": "http_max_connections",
    "http.header_timeout": "http_header_timeout",
    "http.body_timeout": "http_body_timeout",
    "http.max_body_bytes": "http_max_body_bytes",
    # logging, and the scorecard's interval log (uma.server.scorecard_log)
    "logging.level": "log_level",
    "logging.scorecard_interval_s": "scorecard_interval_s",
    "logging.scorecard_csv": "scorecard_csv",
}
PATH_OF: dict[str, str] = {name: path for path, name in NESTED.items()}

# The brief's two class priorities. The daemon has two classes and always serves interactive
# requests first (uma.sched.policy.admit_by_class), so the numbers set no setting: they are
# read only for their order, which must be that one.
QOS = ("qos.interactive.priority", "qos.background.priority")

# every path's sections ("qos", "qos.interactive"): a table there is read as a section
SECTIONS = frozenset(path.rsplit(".", i)[0] for path in (*NESTED, *QOS)
                     for i in range(1, path.count(".") + 1))


def flatten(data: Mapping[object, object], where: str,
            names: Collection[str]) -> tuple[dict[str, object], dict[str, str]]:
    """A file's settings by flat name (types unchecked), and each one's key as the file wrote
    it ('kv.ctx', or 'ctx' for a flat key) for messages. `names`: this build's settings.
    Unknown keys, a setting given twice and a section that is not a table are refused, naming
    the dotted path."""
    values: dict[str, object] = {}
    given: dict[str, str] = {}
    brief: dict[str, object] = {}  # QOS paths given, checked once all are read
    unknown: list[str] = []

    def walk(table: Mapping[object, object], prefix: str) -> None:
        for key, value in table.items():
            path = f"{prefix}{key}"
            if isinstance(value, dict) and path in SECTIONS:
                walk(value, path + ".")
            elif not prefix and path in names:  # a flat key
                put(path, path, value)
            elif path in NESTED and NESTED[path] in names:
                put(NESTED[path], path, value)
            elif path in QOS:
                brief[path] = value
            elif path in SECTIONS:
                keys = sorted({p[len(path) + 1:].split(".")[0] for p in _known(names)
                               if p.startswith(path + ".")})
                raise InvalidRequestError(f"invalid {path} in {where}: must be a table (of "
                                          f"{', '.join(keys)}), not {value!r}")
            elif isinstance(value, dict) and value:  # an unknown section: name its keys
                walk(value, path + ".")
            else:
                unknown.append(path)

    def put(name: str, path: str, value: object) -> None:
        if name in given:
            raise InvalidRequestError(f"{where}: {given[name]} and {path} both set {name}; "
                                      f"give one of them")
        values[name], given[name] = value, path

    walk(data, "")
    if unknown:
        raise InvalidRequestError(f"{where}: unknown setting(s) " + ", ".join(
            f"{path} (nearest: {nearest(path, names)})" for path in unknown))
    _check_brief(brief, where)
    return values, given


def nest(flat: Mapping[str, object]) -> dict[str, Any]:
    """Flat settings' values as nested tables, in NESTED's order (`uma config --nested`)."""
    tree: dict[str, Any] = {}
    for path, name in NESTED.items():
        if name in flat:
            *sections, leaf = path.split(".")
            node = tree
            for section in sections:
                node = node.setdefault(section, {})
            node[leaf] = flat[name]
    return tree


def nearest(path: str, names: Collection[str]) -> str:
    """The known key a mistyped or misplaced one most likely meant: a setting's own name
    written in the wrong section ('scheduler.ctx') is its path ('kv.ctx'); otherwise the most
    similar known key."""
    leaf = path.rsplit(".", 1)[-1]
    if leaf in names and leaf in PATH_OF:
        return PATH_OF[leaf]
    known = [*_known(names), *(names if "." not in path else ())]
    return difflib.get_close_matches(path, known, n=1, cutoff=0.0)[0]


def _known(names: Collection[str]) -> list[str]:
    """The dotted paths a file may hold in this build."""
    return [p for p, name in NESTED.items() if name in names] + list(QOS)


def _check_brief(brief: Mapping[str, object], where: str) -> None:
    given = [p for p in QOS if p in brief]
    for path in given:
        value = brief[path]
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise InvalidRequestError(f"invalid {path} in {where}: must be a number, not "
                                      f"{value!r}")
    if len(given) == 1:
        raise InvalidRequestError(f"{where}: {given[0]} alone says nothing: give both "
                                  f"{' and '.join(QOS)}, whose order is all that is read")
    if not given:
        return
    interactive, background = (brief[p] for p in QOS)
    if not interactive > background:  # type: ignore[operator]  # both numbers, checked above
        raise InvalidRequestError(
            f"{where}: {QOS[0]} ({interactive}) must be above {QOS[1]} ({background}): "
            f"the daemon has these two classes and always serves interactive requests first; "
            f"the numbers are read for that order only")
