"""uma.server.models_api as protocol: which model a request names, and the answer when it is not
the served one (409 where it is available, 404 naming what there is)."""

from __future__ import annotations

from pathlib import Path

from uma.model_dir import ModelFile
from uma.server import models_api
from uma.server import ollama_api as O

LOADED = Path("/models/tiny.gguf")


def model(name: str, path: str | None = None, error: str | None = None) -> ModelFile:
    facts = {} if error else {"architecture": "llama", "quantization": "Q8_0",
                              "context_length": 4096, "n_params": 1_500_000_000}
    return ModelFile(name, Path(path or f"/models/{name}.gguf"), 1000, 1.7e9, **facts,
                     error=error)


LISTING = (model("tiny"), model("qwen"), model("broken", error="not a GGUF file"))


def test_the_loaded_file_is_left_to_its_served_names():
    assert [m.name for m in models_api.others(LISTING, LOADED)] == ["qwen", "broken"]
    assert models_api.others(LISTING, "/elsewhere.gguf") == LISTING


def test_a_file_that_cannot_be_served_says_why():
    e = models_api.not_served("broken", ["tiny"], LISTING)
    assert (e.status, e.code) == (404, "model_not_found")
    assert e.message == "model 'broken' cannot be served: not a GGUF file"


def test_a_model_nowhere_is_a_404_naming_what_there_is():
    e = models_api.not_served("llama3", ["tiny"], models_api.others(LISTING, LOADED),
                              tag=":latest")
    assert (e.status, e.code) == (404, "model_not_found")
    assert e.message == ("model 'llama3' not found; this server has 'tiny:latest' (loaded), "
                         "'qwen:latest'")
    many = tuple(model(f"m{i}") for i in range(models_api.NAMED + 3))
    e = models_api.not_served("x" * 10_000, ["tiny"], many)
    assert e.message.endswith("'m3', 'm4' and 3 more") and len(e.message) < 200
    assert models_api.not_served("x", [], ()).message == \
        "model 'x' not found; this server has no model"


def test_openai_entries_mark_the_loaded_model_and_carry_its_facts():
    entry = models_api.openai_listed(model("qwen"))
    assert entry == {"id": "qwen", "object": "model", "created": 1_700_000_000,
                     "owned_by": "uma", "loaded": False,
                     "meta": {"architecture": "llama", "quantization": "Q8_0",
                              "n_ctx_train": 4096, "n_params": 1_500_000_000, "size": 1000}}


def test_ollama_tags_list_the_loaded_model_first_and_the_usable_others():
    facts = O.ModelFacts(O.Served("tiny"), 1000, "2025-01-01T00:00:00Z", "llama", 8_000_000,
                         "F32", 2048, 128, 2048, None)
    loaded, qwen = O.tags(facts, models_api.others(LISTING, LOADED))["models"]
    assert loaded == {**facts.listed(), "loaded": True}
    assert qwen == {"name": "qwen:latest", "model": "qwen:latest",
                    "modified_at": "2023-11-14T22:13:20Z", "size": 1000, "digest": "",
                    "details": {"parent_model": "", "format": "gguf", "family": "llama",
                                "families": ["llama"], "parameter_size": "1.5B",
                                "quantization_level": "Q8_0"},
                    "loaded": False}
