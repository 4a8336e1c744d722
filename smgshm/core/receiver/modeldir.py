"""The weight-less Qwen2-VL model directory that lets the real gateway send real tensors.

SMG's gateway preprocesses images itself in gRPC mode (smg-facts §5.2): it needs a
tokenizer and configs, never weights. This writes the smallest directory it accepts
(a word-level tokenizer built with ``tokenizers``, Qwen2-VL configs) so that
``smgshm serve`` can stand in for a vLLM or TokenSpeed worker behind ``smg launch``.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from typing import Any

from smgshm.core.errors import HostError

SERVED_MODEL_NAME = "smgshm-qwen2-vl-tiny"
MODEL_TYPE = "qwen2_vl"
ARCHITECTURES = ("Qwen2VLForConditionalGeneration",)
# The one family written here whose image placeholder smg 1.13.0 lets a vLLM worker expand
# (its spec's worker_expandable): only such a model runs under --mm-processing worker. Its
# spec matches config.json model_type and needs its bare image token in the vocabulary.
WORKER_MODEL_TYPE = "minimax_m3_vl"
WORKER_SERVED_MODEL_NAME = "smgshm-minimax-m3-tiny"
WORKER_ARCHITECTURES = ("MiniMaxM3VLForConditionalGeneration",)
M3_TOKENS = ("]<]image[>[", "]<]start of image[>[", "]<]end of image[>[")
MAX_CONTEXT = 32768  # a 2688 px image expands to 9216 image tokens; leave room for several

# Fixed ids, so the configs can name them. <image> must be in the vocabulary: the gateway
# puts one per image part into the rendered prompt and refuses the request when it has no id.
SPECIAL_TOKENS = (
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|vision_pad|>",
    "<|image_pad|>",
    "<|video_pad|>",
    "<image>",
    "[UNK]",
    *M3_TOKENS,
)
_WORD_TEXT = (
    "ok user assistant system describe this image picture photo what is in the a an of and to it "
    "please you i yes no hello world . , ? ! : ;"
)
WORDS = tuple(_WORD_TEXT.split())
REPLY_WORD = "ok"  # the one token serve generates

# A template that prints message['content'] as a string: the gateway then flattens the
# content parts itself and checks for exactly one <image> per image.
CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
FILES = (
    "config.json",
    "preprocessor_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "generation_config.json",
    "special_tokens_map.json",
)


@dataclass(frozen=True)
class ModelDir:
    """A model directory the gateway can load, and what a worker must say about it."""

    path: str
    served_model_name: str
    vocab_size: int
    eos_token_id: int
    image_token_id: int  # <|image_pad|>
    max_context_length: int
    model_type: str
    architectures: tuple[str, ...]
    reply_token_id: int = 0  # the token serve's Generate answers with


def default_model_dir() -> str:
    """``$XDG_CACHE_HOME/smgshm/model-qwen2vl-tiny`` (``~/.cache`` when unset)."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "smgshm", "model-qwen2vl-tiny")


def _vocab() -> dict[str, int]:
    return {tok: i for i, tok in enumerate((*SPECIAL_TOKENS, *WORDS))}


def _tokenizer_json(vocab: dict[str, int]) -> str:
    from tokenizers import AddedToken, Tokenizer, models, pre_tokenizers

    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))  # noqa: S106 - a token, not a password
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    # Added tokens are matched before pre-tokenization, so <|im_start|> stays one token.
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS])
    text: str = tok.to_str()
    return text


def _names(model_type: str) -> tuple[str, tuple[str, ...]]:
    """The served name and architectures of a family."""
    if model_type == WORKER_MODEL_TYPE:
        return WORKER_SERVED_MODEL_NAME, WORKER_ARCHITECTURES
    return SERVED_MODEL_NAME, ARCHITECTURES


def _documents(vocab: dict[str, int], model_type: str) -> dict[str, Any]:
    v = vocab
    eos, pad = v["<|im_end|>"], v["<|endoftext|>"]
    served, archs = _names(model_type)
    config = {
        "architectures": list(archs),
        "model_type": model_type,
        "_name_or_path": served,
        "vocab_size": len(v),
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 1,
        "num_attention_heads": 1,
        "num_key_value_heads": 1,
        "max_position_embeddings": MAX_CONTEXT,
        "bos_token_id": pad,
        "eos_token_id": eos,
        "pad_token_id": pad,
        # The gateway's Qwen2-VL spec needs vision_token_id: the token repeated once per
        # merged patch in the expanded prompt.
        "vision_token_id": v["<|image_pad|>"],
        "image_token_id": v["<|image_pad|>"],
        "video_token_id": v["<|video_pad|>"],
        "vision_start_token_id": v["<|vision_start|>"],
        "vision_end_token_id": v["<|vision_end|>"],
        "image_token_index": v[M3_TOKENS[0]],  # MiniMax-M3's own declaration of its image token
        "vision_config": {"patch_size": 14, "spatial_merge_size": 2, "temporal_patch_size": 2, "in_chans": 3},
        "torch_dtype": "float32",
        "smgshm": "weight-less stand-in written by smgshm; there are no weights",
    }
    preprocessor = {
        "image_processor_type": "Qwen2VLImageProcessor",
        "min_pixels": 3136,
        "max_pixels": 12845056,
        "patch_size": 14,
        "temporal_patch_size": 2,
        "merge_size": 2,
        "image_mean": [0.48145466, 0.4578275, 0.40821073],
        "image_std": [0.26862954, 0.26130258, 0.27577711],
        "do_resize": True,
        "do_rescale": True,
        "do_normalize": True,
        "rescale_factor": 1 / 255,
    }
    tokenizer_config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "unk_token": "[UNK]",
        "model_max_length": MAX_CONTEXT,
        "chat_template": CHAT_TEMPLATE,
    }
    generation = {"bos_token_id": pad, "eos_token_id": [eos, pad], "pad_token_id": pad, "do_sample": False}
    special = {
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "unk_token": "[UNK]",
        "additional_special_tokens": [t for t in SPECIAL_TOKENS if t not in ("<|im_end|>", "<|endoftext|>", "[UNK]")],
    }
    return {
        "config.json": config,
        "preprocessor_config.json": preprocessor,
        "tokenizer_config.json": tokenizer_config,
        "generation_config.json": generation,
        "special_tokens_map.json": special,
    }


def _load(path: str, model_type: str) -> ModelDir | None:
    """The directory's facts, or None when it is not a complete model directory of ``model_type``."""
    try:
        docs = {}
        for name in FILES:
            with open(os.path.join(path, name), "rb") as f:
                docs[name] = json.loads(f.read(16 * 1024 * 1024))
        cfg, tok = docs["config.json"], docs["tokenizer.json"]
        vocab: dict[str, int] = tok["model"]["vocab"]
        added = {a["content"]: int(a["id"]) for a in tok.get("added_tokens", [])}
        ids = {**vocab, **added}
        if cfg.get("model_type") != model_type or "<image>" not in ids or "vision_token_id" not in cfg:
            return None
        if model_type == WORKER_MODEL_TYPE and M3_TOKENS[0] not in ids:
            return None
        served, archs = _names(model_type)
        eos = cfg["eos_token_id"]
        return ModelDir(
            path=os.path.abspath(path),
            served_model_name=served,
            vocab_size=int(cfg.get("vocab_size", len(ids))),
            eos_token_id=int(eos[0] if isinstance(eos, list) else eos),
            image_token_id=int(ids.get("<|image_pad|>", cfg.get("image_token_id", 0))),
            max_context_length=int(cfg.get("max_position_embeddings", MAX_CONTEXT)),
            model_type=model_type,
            architectures=tuple(str(a) for a in cfg.get("architectures", archs)),
            reply_token_id=int(ids.get(REPLY_WORD, 0)),
        )
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def _write(tmp: str, model_type: str) -> None:
    vocab = _vocab()
    with open(os.path.join(tmp, "tokenizer.json"), "w", encoding="utf-8") as f:
        f.write(_tokenizer_json(vocab))
    for name, doc in _documents(vocab, model_type).items():
        with open(os.path.join(tmp, name), "w", encoding="utf-8") as f:
            json.dump(doc, f, indent=2)
            f.write("\n")


def _errname(err: OSError) -> str:
    return errno.errorcode.get(err.errno or 0, str(err.errno))


def ensure_model_dir(path: str | None = None, model_type: str = MODEL_TYPE) -> ModelDir:
    """Write the model directory at ``path`` (default: ``default_model_dir()``) unless complete.

    ``model_type`` is ``MODEL_TYPE`` (Qwen2-VL: the gateway preprocesses images itself) or
    ``WORKER_MODEL_TYPE`` (MiniMax-M3: the one the gateway lets a worker process).

    Written into a temporary sibling and renamed into place, so a reader (or a racing
    writer) sees either nothing or the whole directory. An existing empty directory is
    replaced; a non-empty one that is not a complete model directory is refused and
    left untouched.
    """
    path = os.path.abspath(path or default_model_dir())
    found = _load(path, model_type)
    if found is not None:
        return found
    parent = os.path.dirname(path)
    try:
        os.makedirs(parent, exist_ok=True)
        tmp = tempfile.mkdtemp(prefix=".smgshm-model-", dir=parent)
    except OSError as err:
        raise HostError("cannot create the model directory", path=path, errno=_errname(err)) from err
    try:
        _write(tmp, model_type)
        # mkdtemp makes it 0700; the gateway may run as another user. Nothing in it is secret.
        os.chmod(tmp, 0o755)  # noqa: S103
        try:
            os.rename(tmp, path)  # replaces an empty directory, never a non-empty one
        except OSError as err:
            if err.errno not in (errno.ENOTEMPTY, errno.EEXIST, errno.ENOTDIR):
                raise
    except OSError as err:
        raise HostError("cannot write the model directory", path=path, errno=_errname(err)) from err
    finally:
        with contextlib.suppress(OSError):
            if os.path.isdir(tmp):
                shutil.rmtree(tmp)
    found = _load(path, model_type)
    if found is None:
        raise HostError(
            "path exists and is not a complete model directory",
            path=path,
            hint="pass --model-dir with a new or empty directory",
        )
    return found
