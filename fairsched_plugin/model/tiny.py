"""A tiny random-weight Llama model that vLLM can serve, built offline.

Scheduling experiments need a real engine (real batching, KV-cache blocks, prefill
chunking) but not meaningful text, and CI machines cannot download checkpoints. So the
model is generated: a small Llama-architecture checkpoint with seeded random weights
and a byte-level BPE tokenizer trained on ShareGPT, so that prompt token counts look
like those of a real tokenizer on the same workload.

Every output file is a pure function of the parameters and the ShareGPT data, so two
builds are byte-identical and a build can be skipped when ``fairsched-model.json``
already records the same parameters.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

from fairsched_plugin.cli_types import positive_int
from fairsched_plugin.sharegpt import SharegptReadStats, iter_text
from fairsched_plugin.user_files import output_dir

if TYPE_CHECKING:
    import torch

PROVENANCE_FILE = "fairsched-model.json"
PROVENANCE_FORMAT = 1
MODEL_FILES = (
    "config.json",
    "generation_config.json",
    "model.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
)

UNK, BOS, EOS, PAD = "<unk>", "<s>", "</s>", "<pad>"
SPECIAL_TOKENS = (UNK, BOS, EOS, PAD)
"""In id order: the trainer assigns ids 0..3 in this order, and config.json relies on it."""
BOS_ID, EOS_ID, PAD_ID = 1, 2, 3

CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "<|{{ message['role'] }}|>\n{{ message['content'] }}{{ eos_token }}\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)


DEFAULT_MODEL_DIR = Path(".cache/tiny-model")
"""Where the CLI tools build and look for the tiny model (relative to the working dir)."""


@dataclass(frozen=True)
class TinyModelParams:
    """Everything a build depends on; recorded in the provenance file."""

    vocab_size: int = 8192
    hidden_size: int = 256
    num_layers: int = 4
    num_heads: int = 4
    num_kv_heads: int = 2
    intermediate_size: int = 512
    max_position_embeddings: int = 8192
    seed: int = 0
    num_conversations: int = 2000

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads


def build_tiny_model(
    out_dir: Path,
    *,
    vocab_size: int = 8192,
    hidden_size: int = 256,
    num_layers: int = 4,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    intermediate_size: int = 512,
    max_position_embeddings: int = 8192,
    seed: int = 0,
    num_conversations: int = 2000,
    sharegpt_path: Path | None = None,
    force: bool = False,
) -> Path:
    """Build the model into ``out_dir`` (created if needed) and return ``out_dir``.

    Skips the work when ``out_dir`` already holds a complete build with the same
    parameters, unless ``force``. ``sharegpt_path`` overrides the packaged ShareGPT
    file used to train the tokenizer.
    """
    params = TinyModelParams(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        num_layers=num_layers,
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        intermediate_size=intermediate_size,
        max_position_embeddings=max_position_embeddings,
        seed=seed,
        num_conversations=num_conversations,
    )
    _validate(params)
    out_dir = Path(out_dir)
    if not force and is_built(out_dir, params):
        return out_dir
    out_dir.mkdir(parents=True, exist_ok=True)
    # Drop the old record first: an interrupted rebuild must not look complete.
    (out_dir / PROVENANCE_FILE).unlink(missing_ok=True)

    stats = SharegptReadStats()
    tokenizer = _train_tokenizer(params, sharegpt_path, stats)
    tokenizer.save(str(out_dir / "tokenizer.json"))
    _write_json(out_dir / "tokenizer_config.json", _tokenizer_config(params))
    _write_json(out_dir / "config.json", _model_config(params))
    _write_json(out_dir / "generation_config.json", _generation_config())
    # torch only for writing weights: the tools that merely name the model stay quick.
    from safetensors.torch import save

    # save() rather than save_file(): the latter leaves the file mode 0600.
    weights = save(_random_weights(params), metadata={"format": "pt"})
    (out_dir / "model.safetensors").write_bytes(weights)
    _write_json(out_dir / PROVENANCE_FILE, _provenance(params, stats, tokenizer))
    return out_dir


def is_built(out_dir: Path, params: TinyModelParams) -> bool:
    """Whether ``out_dir`` holds every model file and a provenance record for ``params``.

    The provenance file is written last, so its presence means the build finished.
    """
    try:
        recorded = json.loads((out_dir / PROVENANCE_FILE).read_text())
    except (OSError, ValueError):
        return False
    return (
        recorded.get("format") == PROVENANCE_FORMAT
        and recorded.get("params") == asdict(params)
        and all((out_dir / name).is_file() for name in MODEL_FILES)
    )


def _validate(params: TinyModelParams) -> None:
    if params.hidden_size % params.num_heads:
        raise ValueError("hidden_size must be a multiple of num_heads")
    if params.num_heads % params.num_kv_heads:
        raise ValueError("num_heads must be a multiple of num_kv_heads")
    if params.vocab_size <= 256 + len(SPECIAL_TOKENS):
        raise ValueError("vocab_size must exceed the 256 byte tokens plus the special tokens")
    if params.num_conversations <= 0:
        raise ValueError("num_conversations must be positive")


def _train_tokenizer(
    params: TinyModelParams, sharegpt_path: Path | None, stats: SharegptReadStats
) -> Tokenizer:
    """Byte-level BPE (GPT-2 style, so any text round-trips) trained on ShareGPT turns."""
    tokenizer = Tokenizer(models.BPE(unk_token=UNK))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=params.vocab_size,
        min_frequency=2,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    texts = iter_text(sharegpt_path, params.num_conversations, stats)
    tokenizer.train_from_iterator(texts, trainer=trainer)
    # Llama convention: prompts start with BOS, which vLLM's completions path relies on.
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A",
        pair=f"{BOS} $A {BOS} $B",
        special_tokens=[(BOS, BOS_ID)],
    )
    return tokenizer


def _tokenizer_config(params: TinyModelParams) -> dict[str, Any]:
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": BOS,
        "eos_token": EOS,
        "pad_token": PAD,
        "unk_token": UNK,
        "model_max_length": params.max_position_embeddings,
        # The default (True) rewrites " ." to "." on decode, breaking round trips.
        "clean_up_tokenization_spaces": False,
        "chat_template": CHAT_TEMPLATE,
    }


def _model_config(params: TinyModelParams) -> dict[str, Any]:
    rope_theta = 10000.0
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": params.vocab_size,
        "hidden_size": params.hidden_size,
        "intermediate_size": params.intermediate_size,
        "num_hidden_layers": params.num_layers,
        "num_attention_heads": params.num_heads,
        "num_key_value_heads": params.num_kv_heads,
        "head_dim": params.head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": params.max_position_embeddings,
        "initializer_range": 0.02,
        "rms_norm_eps": 1e-5,
        # Both spellings: transformers 5 reads rope_parameters, 4.x reads rope_theta.
        "rope_theta": rope_theta,
        "rope_parameters": {"rope_type": "default", "rope_theta": rope_theta},
        "attention_bias": False,
        "attention_dropout": 0.0,
        "mlp_bias": False,
        "tie_word_embeddings": True,
        "use_cache": True,
        "bos_token_id": BOS_ID,
        "eos_token_id": EOS_ID,
        "pad_token_id": PAD_ID,
        "torch_dtype": "bfloat16",
    }


def _generation_config() -> dict[str, Any]:
    return {"bos_token_id": BOS_ID, "eos_token_id": EOS_ID, "pad_token_id": PAD_ID}


def _random_weights(params: TinyModelParams) -> dict[str, torch.Tensor]:
    """Seeded N(0, 0.02) matrices and unit norms, in Hugging Face Llama naming.

    No ``lm_head.weight``: the output projection is tied to the embeddings.
    """
    import torch

    generator = torch.Generator().manual_seed(params.seed)
    h, kv = params.hidden_size, params.num_kv_heads * params.head_dim
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (params.vocab_size, h)}
    for i in range(params.num_layers):
        layer = f"model.layers.{i}"
        shapes |= {
            f"{layer}.input_layernorm.weight": (h,),
            f"{layer}.self_attn.q_proj.weight": (h, h),
            f"{layer}.self_attn.k_proj.weight": (kv, h),
            f"{layer}.self_attn.v_proj.weight": (kv, h),
            f"{layer}.self_attn.o_proj.weight": (h, h),
            f"{layer}.post_attention_layernorm.weight": (h,),
            f"{layer}.mlp.gate_proj.weight": (params.intermediate_size, h),
            f"{layer}.mlp.up_proj.weight": (params.intermediate_size, h),
            f"{layer}.mlp.down_proj.weight": (h, params.intermediate_size),
        }
    shapes["model.norm.weight"] = (h,)
    return {
        name: _init_tensor(shape, generator).to(torch.bfloat16)
        for name, shape in shapes.items()
    }


def _init_tensor(shape: tuple[int, ...], generator: torch.Generator) -> torch.Tensor:
    import torch

    if len(shape) == 1:
        return torch.ones(shape)
    return torch.normal(0.0, 0.02, shape, generator=generator)


def _provenance(
    params: TinyModelParams, stats: SharegptReadStats, tokenizer: Tokenizer
) -> dict[str, Any]:
    return {
        "format": PROVENANCE_FORMAT,
        "params": asdict(params),
        "tokenizer_vocab_size": tokenizer.get_vocab_size(),
        "sharegpt_conversations_used": stats.conversations,
        "sharegpt_records_skipped": stats.skipped,
    }


def _write_json(path: Path, obj: dict[str, Any]) -> None:
    path.write_text(json.dumps(obj, indent=2, sort_keys=True) + "\n")


def add_cli(subparsers: argparse._SubParsersAction) -> None:
    """Register ``model tiny --out DIR`` on a top-level argparse subparsers object."""
    model = subparsers.add_parser(
        "model", help="build test models",
        description="Builds models for tests, the demo and CPU benchmarks.")
    model_commands = model.add_subparsers(dest="model_command", required=True)
    tiny = model_commands.add_parser(
        "tiny", help="build the tiny random-weight Llama model used by tests and benchmarks",
        description="Builds a small Llama model with random weights and a byte-level BPE "
                    "tokenizer trained on the packaged ShareGPT conversations, for vLLM "
                    "on CPU. The build is deterministic and skipped when --out already "
                    "holds the same one; prints the model directory.")
    defaults = TinyModelParams()
    tiny.add_argument("--out", type=Path, required=True, help="model directory to (re)build")
    tiny.add_argument("--vocab-size", type=positive_int, default=defaults.vocab_size,
                      help="tokenizer and embedding vocabulary size")
    tiny.add_argument("--seed", type=int, default=defaults.seed,
                      help="seed of the random weights")
    tiny.add_argument(
        "--num-conversations",
        type=positive_int,
        default=defaults.num_conversations,
        help="ShareGPT conversations to train the tokenizer on",
    )
    tiny.add_argument(
        "--force", action="store_true", help="rebuild even if --out holds the same build"
    )
    tiny.set_defaults(func=main_tiny)


def main_tiny(args: argparse.Namespace) -> int:
    """CLI entry: build the model and print where it is."""
    try:
        out = build_tiny_model(
            output_dir(args.out),
            vocab_size=args.vocab_size,
            seed=args.seed,
            num_conversations=args.num_conversations,
            force=args.force,
        )
    except (OSError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(out)
    return 0
