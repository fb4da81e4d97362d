"""zoo's text models as Hugging Face transformers models: a config, a causal LM and two tokenizers.

Once zoo is imported, a zoo text release folder (or a Hub repository holding one) loads through
transformers' own entry points, with no `trust_remote_code`:

    import zoo
    from transformers import AutoModelForCausalLM, AutoTokenizer, pipeline

    model = AutoModelForCausalLM.from_pretrained("checkpoints/gpt-tiny.shakespeare")
    tokenizer = AutoTokenizer.from_pretrained("checkpoints/gpt-tiny.shakespeare")
    pipeline("text-generation", model="checkpoints/gpt-tiny.shakespeare")("ROMEO:", max_new_tokens=20)

How the two libraries share one folder:
- config.json is zoo's (format_version, class, args, ...) with "model_type": "zoo_text", the key
  AutoConfig dispatches on. `ZooTextConfig` keeps zoo's layout as it is (the TextTransformer's
  arguments stay under "args"), so what transformers' `save_pretrained` writes, zoo.load reads.
- model.safetensors is read by zoo's own loader (zoo.models.pretrained.load_release: the header
  checked first, finite floats only, never a pickle), so both libraries load the same bits.
  `ZooTextForCausalLM` holds the TextTransformer's modules under their own names (tok_embed,
  blocks.0..., head), so its state dict has zoo's keys and transformers' `save_pretrained`
  writes a folder zoo.load reads bit for bit.
- The tokenizer comes from the config's "tokenizer" argument: `ZooCharTokenizer` (a
  PreTrainedTokenizer) for character-level models, `ZooBPETokenizer` (a PreTrainedTokenizerFast
  over the same `tokenizers` JSON) for byte-level BPE ones.
- `generate` carries zoo's decoding state as the cache (`ZooDecodingState`: each block's KV
  cache, or micro's and elita's constant-size sums), and slides the window past context_length
  for learned positions as zoo's own `generate` does, so greedy tokens are zoo's, token for token.

This module imports transformers; zoo/release/transformers_hook.py imports it once transformers
itself has been imported, and registers these classes with the Auto classes.
"""

from __future__ import annotations

import importlib.util
import inspect
import json
import os
from pathlib import Path

import torch
import torch.nn.functional as F
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    AutoTokenizer,
    GenerationConfig,
    GenerationMixin,
    PreTrainedConfig,
    PreTrainedModel,
    PreTrainedTokenizer,
    PreTrainedTokenizerFast,
)
from transformers.modeling_outputs import CausalLMOutputWithPast

from zoo.models.pretrained import MODEL_TYPES, load_release
from zoo.models.release_files import CONFIG, FORMAT_VERSION, WEIGHTS, read_config
from zoo.models.text_transformer import TextTransformer
from zoo.models.tokenizer import BPETokenizer, CharTokenizer, tokenizer_from_dict

MODEL_TYPE = MODEL_TYPES["TextTransformer"]
TOKENIZER_CONFIG = "tokenizer_config.json"
# from_pretrained's keywords that mean nothing for a zoo release (where the weights come from is fixed: one
# safetensors file, read by zoo) and are accepted so that tools passing them (pipelines, evaluation harnesses) work
_IGNORED = {"_from_auto", "_from_pipeline", "trust_remote_code", "adapter_kwargs", "code_revision", "proxies",
            "force_download", "low_cpu_mem_usage", "attn_implementation", "use_kernels", "key_mapping",
            "resume_download", "offload_folder", "offload_state_dict", "offload_buffers", "max_memory",
            "tp_plan", "tp_size", "device_mesh", "variant", "weights_only", "disable_mmap"}

# from_pretrained's keywords (most of them in its **kwargs) for other kinds of checkpoint, or other ways of loading
_THEIRS = {"gguf_file", "quantization_config", "ignore_mismatched_sizes", "fusion_config", "kernel_config",
           "distributed_config", "generation_config", "state_dict", "from_tf", "from_flax", "load_in_8bit",
           "load_in_4bit", "parallelism_config", "kernels_mode", "distributed_checkpoint_dir"}


class ZooTextConfig(PreTrainedConfig):
    """transformers' view of a zoo text release's config.json: zoo's layout, unchanged.

    The TextTransformer's constructor arguments stay under `args`; the names transformers' tools read
    (vocab_size, hidden_size, num_hidden_layers, num_attention_heads, max_position_embeddings,
    tie_word_embeddings) are read from them. Every other key of the file (metrics, training, ...) is kept and
    written back by `save_pretrained`.

    Args:
        format_version: zoo's release format, an int in [1, zoo's FORMAT_VERSION] (default: the current).
        args: TextTransformer's constructor arguments, a dict; default None: TextTransformer's defaults.
        model_name: the registered zoo model the release was trained as (e.g. "gpt-tiny"), or None.
        architecture: zoo's name of the class (default "TextTransformer").
        **kwargs (Any): the file's other keys ("class", "module", "metrics", ...) and transformers' own.
    """

    model_type = MODEL_TYPE
    format_version: int = FORMAT_VERSION
    args: dict | None = None
    model_name: str | None = None
    architecture: str = "TextTransformer"

    def __post_init__(self, **kwargs):
        kwargs.setdefault("class", "TextTransformer")
        kwargs.setdefault("module", TextTransformer.__module__)
        super().__post_init__(**kwargs)
        if self.args is None:
            self.args = dict(TextTransformer().config)

    def zoo_config(self) -> dict:
        """zoo's config.json for this config, checked as zoo.load checks one (format_version, a registered class,
        only arguments the class takes)."""
        keys = {"format_version": self.format_version, "class": getattr(self, "class"), "args": self.args,
                "module": getattr(self, "module", None), "model_name": self.model_name}
        where = Path(self.name_or_path or "ZooTextConfig") / CONFIG
        config = read_config(json.dumps(keys).encode(), where)
        if config["class"] != "TextTransformer":
            raise ValueError(f"{where}: class {config['class']!r} is not a zoo text model; transformers loads zoo's "
                             "TextTransformer releases (model_type 'zoo_text')")
        return config

    def _arg(self, name: str):
        args = self.args or {}
        return args[name] if name in args else _DEFAULTS[name]

    @property
    def vocab_size(self) -> int:
        return self._arg("vocab_size")

    @property
    def hidden_size(self) -> int:
        return self._arg("embed_dim")

    @property
    def num_hidden_layers(self) -> int:
        return self._arg("depth")

    @property
    def num_attention_heads(self) -> int:
        return self._arg("num_heads")

    @property
    def max_position_embeddings(self) -> int:
        # the context the model was trained on; with learned positions also the longest input it takes
        return self._arg("context_length")

    @property
    def tie_word_embeddings(self) -> bool:
        return self._arg("tie_embeddings")

    @property
    def tokenizer_class(self) -> str | None:
        """The transformers tokenizer for the config's tokenizer: ZooCharTokenizer or ZooBPETokenizer."""
        kind = ((self.args or {}).get("tokenizer") or {}).get("type")
        return {"char": ZooCharTokenizer.__name__, "bpe": ZooBPETokenizer.__name__}.get(kind)


# TextTransformer's defaults, for the arguments a config leaves out (tie_embeddings is kept only where False)
_DEFAULTS = {name: parameter.default for name, parameter in inspect.signature(TextTransformer).parameters.items()}


class ZooDecodingState:
    """zoo's decoding state carried through transformers' `generate` as its cache.

    Each block's state as `TextTransformer.forward_step` returns it (a KV cache, micro's or elita's sums,
    incontext's keys, values and gate sums, a short convolution's last inputs), with what zoo's own `generate`
    keeps beside it: how many tokens the states hold (the position of the next one), each row's first real token
    where prompts were left-padded, and whether they were.

    Args:
        states: the blocks' states, from `TextTransformer.forward_step`.
        column: the tokens the states hold, padding included.
        first: (batch, 1) the column of each row's first real token, or None where no prompt was padded.
        seen: the tokens of the sequence consumed so far (generate's `get_seq_length`).
    """

    is_compileable = False
    is_croppable = False

    def __init__(self, states: list, column: int, first: torch.Tensor | None, seen: int):
        self.states, self.column, self.first, self.seen = states, column, first, seen

    def get_seq_length(self, layer_idx: int = 0) -> int:
        """The tokens consumed so far (transformers' name).

        Args:
            layer_idx: ignored: every block has seen the same tokens.
        """
        return self.seen


class ZooTextForCausalLM(PreTrainedModel, GenerationMixin):
    """A zoo TextTransformer as a transformers causal language model.

    The TextTransformer's modules are this model's own (same names, same tensors), so its state dict is zoo's:
    `save_pretrained` writes a folder that zoo.load reads, and `from_pretrained` reads a zoo release folder, or a
    Hub repository holding one, through zoo's loader (safetensors only).

    Args:
        config: the ZooTextConfig; its `args` build the TextTransformer, with random weights.
        zoo_model: an existing TextTransformer to wrap (its modules are shared, not copied); default None: build one
            from `config.args`.
    """

    config_class = ZooTextConfig
    base_model_prefix = ""
    main_input_name = "input_ids"
    _tied_weights_keys = {"head.weight": "tok_embed.weight"}  # applies where the config's tie_word_embeddings
    _no_split_modules = ["Block"]
    _supports_sdpa = True  # zoo's blocks choose their own kernels; no transformers attention is used
    _supports_attention_backend = True

    def __init__(self, config: ZooTextConfig, zoo_model: TextTransformer | None = None):
        super().__init__(config)
        args = config.zoo_config()["args"]
        if zoo_model is None:
            zoo_model = TextTransformer(**args)
        elif not isinstance(zoo_model, TextTransformer) or zoo_model.config != args:
            raise ValueError("ZooTextForCausalLM zoo_model must be a TextTransformer built with config.args")
        # Kept outside the module tree (its modules are registered below, under their own names), so that the
        # state dict has zoo's keys and not "zoo_model."-prefixed ones.
        self.__dict__["zoo_model"] = zoo_model
        for name, child in zoo_model.named_children():
            self.add_module(name, child)
        for name, parameter in zoo_model.named_parameters(recurse=False):
            self.register_parameter(name, parameter)
        self.post_init()

    def _init_weights(self, module) -> None:
        """Nothing: zoo's modules initialize themselves when built, and loading replaces every weight."""

    def get_input_embeddings(self):
        return self.zoo_model.tok_embed

    def get_output_embeddings(self):
        return self.zoo_model.head

    @classmethod
    def _supports_default_dynamic_cache(cls) -> bool:
        return False  # the cache is zoo's decoding state, made by forward (ZooDecodingState)

    @classmethod
    def from_zoo(cls, zoo_model: TextTransformer, extra: dict | None = None) -> ZooTextForCausalLM:
        """Wrap a TextTransformer (sharing its modules) as a transformers model.

        Args:
            zoo_model: the TextTransformer, e.g. from zoo.load or zoo.create.
            extra: more keys for the config (e.g. a release's metrics); default None.

        Returns:
            The transformers model, in the wrapped model's training mode.
        """
        if not isinstance(zoo_model, TextTransformer):
            raise TypeError(f"ZooTextForCausalLM.from_zoo takes a TextTransformer, got {type(zoo_model).__name__}")
        config = ZooTextConfig(args=zoo_model.config, model_name=getattr(zoo_model, "model_name", None),
                               **(extra or {}))
        model = cls(config, zoo_model=zoo_model)
        return model.train(zoo_model.training)

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path, *model_args, config=None, cache_dir=None,
                        local_files_only: bool = False, token=None, revision: str | None = None,
                        use_safetensors: bool | None = None, dtype=None, torch_dtype=None, device_map=None,
                        subfolder: str = "", **kwargs) -> ZooTextForCausalLM:
        """Load a zoo text release folder, or a Hub repository holding one, with zoo's loader.

        Args:
            pretrained_model_name_or_path: a release folder (config.json and model.safetensors) or a Hub id
                "org/name".
            *model_args: none are taken.
            config: a ZooTextConfig to use instead of the folder's (its args must build the stored weights'
                shapes); default None: the folder's.
            cache_dir: huggingface_hub's cache folder, for Hub ids; default None: its default.
            local_files_only: for Hub ids, use the cache only (default False).
            token: the Hub token, for Hub ids; default None: huggingface_hub's default.
            revision: a branch, tag or commit, for Hub ids; default None: the main branch.
            use_safetensors: None or True; False is refused: zoo loads safetensors only.
            dtype: None or "auto" (the stored float32), or a torch dtype (or its name) to cast to.
            torch_dtype: transformers' older name for dtype.
            device_map: None, a device ("cpu", "cuda:0", torch.device, an index) or {"": device}.
            subfolder: "" only (a release is a whole folder).
            **kwargs (Any): transformers' loading keywords that do not apply here (ignored, e.g.
                trust_remote_code), or config attributes to set.

        Returns:
            The model, in eval mode.
        """
        owner = f"{cls.__name__}.from_pretrained"
        if model_args:
            raise TypeError(f"{owner} takes no positional arguments after the source, got {len(model_args)}")
        if use_safetensors is False:
            raise ValueError(f"{owner}: zoo releases are safetensors only ({WEIGHTS}); use_safetensors=False "
                             "would ask for a pickle, which zoo never loads")
        if subfolder:
            raise ValueError(f"{owner}: a zoo release is a whole folder; subfolder={subfolder!r} is not supported")
        if config is not None and not isinstance(config, ZooTextConfig):
            raise TypeError(f"{owner} config must be a ZooTextConfig, got {type(config).__name__}")
        loading_info = kwargs.pop("output_loading_info", False)
        settable = {k: kwargs.pop(k) for k in list(kwargs) if k not in _IGNORED and config is not None
                    and hasattr(config, k)}
        # transformers' own loading keywords left at their defaults (gguf_file=None, ...) ask for nothing: tools pass
        # them all; set to something, they ask for what a zoo release is not (a GGUF file, a quantized load)
        theirs = _THEIRS | set(inspect.signature(PreTrainedModel.from_pretrained).parameters)
        asked = sorted(k for k in kwargs if k not in _IGNORED and k in theirs and kwargs[k] not in (None, False))
        if asked:
            raise ValueError(f"{owner}: {asked[0]}={kwargs[asked[0]]!r} is not supported for a zoo release (one "
                             f"safetensors file, loaded by zoo)")
        unknown = sorted(k for k in kwargs if k not in _IGNORED and k not in theirs)
        if unknown:
            raise TypeError(f"{owner} got an unexpected keyword argument {unknown[0]!r}")
        folder = release_folder(pretrained_model_name_or_path, cache_dir=cache_dir, token=token, revision=revision,
                                local_files_only=local_files_only)
        file_config = ZooTextConfig.from_pretrained(folder)
        file_config.zoo_config()  # refused in one line before anything is built
        config = config if config is not None else file_config
        for key, value in settable.items():
            setattr(config, key, value)
        overrides = {k: v for k, v in config.zoo_config()["args"].items() if file_config.args.get(k) != v}
        zoo_model = load_release(folder, **overrides)
        config._name_or_path = str(pretrained_model_name_or_path)
        model = cls(config, zoo_model=zoo_model)
        model.name_or_path = str(pretrained_model_name_or_path)
        if (folder / "generation_config.json").is_file():
            model.generation_config = GenerationConfig.from_pretrained(folder)
        dtype = torch_dtype if dtype is None else dtype
        if dtype is not None and dtype != "auto":
            model.to(dtype=_dtype(dtype, owner))
        device = _device(device_map, owner)
        if device is not None:
            model.to(device)
        model.eval()
        if loading_info:  # zoo's loading is strict: every tensor was in the file, with its shape
            return model, {"missing_keys": [], "unexpected_keys": [], "mismatched_keys": [], "error_msgs": []}
        return model

    def prepare_inputs_for_generation(self, input_ids: torch.LongTensor, next_sequence_length: int | None = None,
                                      cache: ZooDecodingState | None = None,
                                      attention_mask: torch.Tensor | None = None, use_cache: bool | None = None,
                                      inputs_embeds: torch.Tensor | None = None, **kwargs) -> dict:
        """The next call of forward in `generate`, choosing as zoo's `generate` does: the prompt from no state,
        then one token at a time from the state, and past context_length (learned positions) the last
        context_length tokens again from no state.

        Args:
            input_ids: the whole sequence so far, (batch, length).
            next_sequence_length: the tokens at the end not yet in the state (generate's count); default None.
            cache: the ZooDecodingState the last forward returned, or None.
            attention_mask: (batch, length), 1 for real tokens (left padding 0); default None: all real.
            use_cache: carry the state from step to step (default True); False recomputes every step.
            inputs_embeds: not supported (zoo's models take token ids).
            **kwargs (Any): generate's other model inputs, passed on.
        """
        if inputs_embeds is not None:
            raise ValueError(f"{type(self).__name__} generates from token ids (input_ids), not inputs_embeds")
        use_cache = True if use_cache is None else use_cache
        padded = attention_mask is not None and not bool(attention_mask.all())
        window = self.zoo_model.context_length if self.zoo_model.pos_kind == "learned" else None
        restart = cache is None or not use_cache or (window is not None and cache.column >= window)
        if restart:
            ids = input_ids[:, -window:] if window else input_ids
            mask = attention_mask[:, -ids.shape[1]:] if padded else None
            return {"input_ids": ids, "attention_mask": mask, "cache": None, "use_cache": use_cache,
                    "_seen": input_ids.shape[1], "_padded": padded}
        new = next_sequence_length if next_sequence_length is not None else input_ids.shape[1] - cache.seen
        return {"input_ids": input_ids[:, -new:], "cache": cache, "use_cache": True,
                "_seen": input_ids.shape[1], "_padded": padded}

    def forward(self, input_ids: torch.LongTensor | None = None, attention_mask: torch.Tensor | None = None,
                labels: torch.LongTensor | None = None, cache: ZooDecodingState | None = None,
                use_cache: bool | None = None, return_dict: bool | None = None,
                inputs_embeds: torch.Tensor | None = None, logits_to_keep: int = 0, _seen: int | None = None,
                _padded: bool | None = None, **kwargs) -> CausalLMOutputWithPast | tuple:
        """Next-token logits, and the loss where labels are given (transformers' causal LM convention).

        Args:
            input_ids: token ids (batch, length).
            attention_mask: (batch, length), 1 for real tokens, 0 for padding (left or right); default None.
            labels: (batch, length) token ids to predict, -100 where none; the model shifts them (label t is
                predicted from the tokens before it). Default None: no loss.
            cache: a ZooDecodingState to continue from (generate passes it); default None.
            use_cache: return the decoding state after these tokens (default False outside generate).
            return_dict: return a CausalLMOutputWithPast (default True) or a tuple.
            inputs_embeds: not supported (zoo's models take token ids).
            logits_to_keep: keep only the last this many positions' logits (0, the default: all).
            _seen: generate's bookkeeping: the whole sequence's length.
            _padded: generate's bookkeeping: whether any prompt was padded (zoo's generate passes the mask then).
            **kwargs (Any): transformers' other keywords (position_ids, output_attentions, ...), unused: zoo's
                blocks compute their own positions from the mask.
        """
        owner = type(self).__name__
        if inputs_embeds is not None or input_ids is None:
            raise ValueError(f"{owner} takes token ids (input_ids), not inputs_embeds")
        model = self.zoo_model
        mask = None
        if attention_mask is not None:
            if attention_mask.shape != input_ids.shape:
                raise ValueError(f"{owner} attention_mask must have input_ids' shape {tuple(input_ids.shape)}, "
                                 f"got {tuple(attention_mask.shape)}")
            mask = attention_mask.bool()
            if not _padded and bool(mask.all()):
                mask = None  # zoo passes no mask where every token is real (same kernels, same bits)
        state = None
        if cache is not None:  # one step on from the state, at the position after its tokens
            start = cache.column if cache.first is None else cache.column - cache.first
            logits, states = model.forward_step(input_ids, cache.states, start)
            state = ZooDecodingState(states, cache.column + input_ids.shape[1], cache.first,
                                     _seen if _seen is not None else cache.seen + input_ids.shape[1])
        elif use_cache:
            logits, states = model.forward_step(input_ids, key_padding_mask=mask)
            first = None if mask is None else mask.long().argmax(1, keepdim=True)
            state = ZooDecodingState(states, input_ids.shape[1], first,
                                     _seen if _seen is not None else input_ids.shape[1])
        else:
            logits = model(input_ids, key_padding_mask=mask)
        loss = None
        if labels is not None:
            if labels.shape != input_ids.shape:
                raise ValueError(f"{owner} labels must have input_ids' shape {tuple(input_ids.shape)}, got "
                                 f"{tuple(labels.shape)}")
            loss = F.cross_entropy(logits[:, :-1].flatten(0, 1).float(), labels[:, 1:].flatten(), ignore_index=-100)
        if logits_to_keep:
            logits = logits[:, -logits_to_keep:]
        if return_dict is False:
            return tuple(v for v in (loss, logits, state) if v is not None)
        return CausalLMOutputWithPast(loss=loss, logits=logits, cache=state)


def release_folder(source, cache_dir=None, token=None, revision: str | None = None,
                   local_files_only: bool = False) -> Path:
    """The local release folder of `source`: a folder as it is, a Hub id downloaded by zoo's checked download.

    Args:
        source: a release folder, or a Hub repository id "org/name".
        cache_dir: huggingface_hub's cache folder; default None: its default.
        token: the Hub token; default None: huggingface_hub's default.
        revision: a branch, tag or commit; default None: the main branch.
        local_files_only: use the cache only (default False).
    """
    from zoo.models.hub import download

    path = Path(os.fspath(source)).expanduser()
    if path.is_dir():
        return path
    text = str(source)
    hub = text if text.startswith("hf-hub:") else f"hf-hub:{text}"
    if revision and "@" not in hub:
        hub += f"@{revision}"
    return download(hub, token=token, cache_dir=None if cache_dir is None else str(cache_dir),
                    local_files_only=local_files_only)


def _dtype(value, owner: str) -> torch.dtype:
    dtype = getattr(torch, value, None) if isinstance(value, str) else value
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise ValueError(f"{owner} dtype must be 'auto' or a floating-point torch dtype, got {value!r}")
    return dtype


def _device(device_map, owner: str) -> torch.device | None:
    if device_map is None:
        return None
    if isinstance(device_map, dict) and set(device_map) == {""}:
        device_map = device_map[""]
    if device_map == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        return torch.device(device_map)
    except (TypeError, RuntimeError):
        raise ValueError(f"{owner} device_map must be None, 'auto', one device or {{'': device}} (a zoo model is "
                         f"not split across devices), got {device_map!r}") from None


def _zoo_tokenizer(source, kwargs: dict):
    """zoo's tokenizer from the config.json of `source` (a folder or a Hub id), or None where its args have none."""
    from transformers.utils import cached_file

    hub = {k: kwargs[k] for k in ("cache_dir", "token", "revision", "local_files_only") if kwargs.get(k) is not None}
    path = Path(os.fspath(source))
    file = path / CONFIG if path.is_dir() else Path(cached_file(str(source), CONFIG, **hub))
    config = read_config(file.read_bytes(), file)
    spec = config["args"].get("tokenizer")
    return tokenizer_from_dict(spec) if spec else None


def _has_tokenizer_files(source, kwargs: dict) -> bool:
    """Whether `source` holds a tokenizer saved by transformers (tokenizer_config.json), rather than only zoo's."""
    path = Path(os.fspath(source))
    if path.is_dir():
        return (path / TOKENIZER_CONFIG).is_file()
    from transformers.utils import cached_file

    hub = {k: kwargs[k] for k in ("cache_dir", "token", "revision", "local_files_only") if kwargs.get(k) is not None}
    return cached_file(str(source), TOKENIZER_CONFIG, _raise_exceptions_for_missing_entries=False, **hub) is not None


class _FromZooRelease:
    """`from_pretrained` for a zoo release folder: the tokenizer in its config.json's args (zoo's own), unless
    transformers saved one there (tokenizer_config.json)."""

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path, *args, **kwargs):
        """The tokenizer of a zoo release folder or Hub id (its config.json's args.tokenizer), or one transformers
        saved (tokenizer_config.json), which transformers' own loading reads.

        Args:
            pretrained_model_name_or_path: a folder or a Hub id "org/name".
            *args (Any): passed on to transformers' loading, for a tokenizer it saved.
            **kwargs (Any): transformers' loading keywords (cache_dir, token, revision, local_files_only, ...).
        """
        if _has_tokenizer_files(pretrained_model_name_or_path, kwargs):
            return super().from_pretrained(pretrained_model_name_or_path, *args, **kwargs)
        tokenizer = _zoo_tokenizer(pretrained_model_name_or_path, kwargs)
        if tokenizer is None:
            raise ValueError(f"{pretrained_model_name_or_path}: this zoo release has no tokenizer (its args.tokenizer "
                             "is empty); it takes token ids only")
        return from_zoo_tokenizer(tokenizer, name_or_path=str(pretrained_model_name_or_path))


class ZooCharTokenizer(_FromZooRelease, PreTrainedTokenizer):
    """zoo's character-level tokenizer as a transformers tokenizer: each character of `chars` is one token, and
    no special tokens are added, as in zoo (a character outside the vocabulary is refused, naming it).

    Args:
        chars: the vocabulary, a string of distinct characters (token i is chars[i]).
        **kwargs (Any): PreTrainedTokenizer's keywords (padding_side, ...).
    """

    vocab_files_names: dict = {}
    model_input_names = ["input_ids", "attention_mask"]

    def __init__(self, chars: str, **kwargs):
        self.zoo_tokenizer = CharTokenizer(chars)
        kwargs.setdefault("clean_up_tokenization_spaces", False)  # zoo decodes characters exactly
        super().__init__(chars=chars, **kwargs)

    @property
    def vocab_size(self) -> int:
        return self.zoo_tokenizer.vocab_size

    def get_vocab(self) -> dict[str, int]:
        return {**self.zoo_tokenizer.index, **self.added_tokens_encoder}

    def _tokenize(self, text: str, **kwargs) -> list[str]:
        unknown = self.zoo_tokenizer.unknown(text)
        if unknown:
            raise ValueError(f"characters not in the tokenizer's vocabulary of {self.vocab_size}: {unknown[:10]!r}")
        return list(text)

    def _convert_token_to_id(self, token: str) -> int:
        return self.zoo_tokenizer.index[token]

    def _convert_id_to_token(self, index: int) -> str:
        return self.zoo_tokenizer.chars[index]

    def convert_tokens_to_string(self, tokens: list[str]) -> str:
        """The text of `tokens`, as zoo decodes it: the characters joined, nothing cleaned up.

        Args:
            tokens: characters of the vocabulary.
        """
        return "".join(tokens)

    def save_vocabulary(self, save_directory: str, filename_prefix: str | None = None) -> tuple:
        """No file: the vocabulary is `chars`, which transformers writes into tokenizer_config.json.

        Args:
            save_directory: the folder transformers saves the tokenizer in.
            filename_prefix: a prefix for the vocabulary files' names (none are written).
        """
        return ()


class ZooBPETokenizer(_FromZooRelease, PreTrainedTokenizerFast):
    """zoo's byte-level BPE tokenizer as a transformers fast tokenizer, over the same `tokenizers` JSON.

    Args:
        tokenizer_object: the `tokenizers.Tokenizer` (zoo's BPETokenizer holds it).
        **kwargs (Any): PreTrainedTokenizerFast's keywords (tokenizer_file, padding_side, ...).
    """

    # No __init__ of its own: transformers then reads a saved tokenizer.json whole (merges included), as it reads
    # its own TokenizersBackend's, instead of rebuilding the model from a vocabulary


def from_zoo_tokenizer(tokenizer, name_or_path: str = "") -> ZooCharTokenizer | ZooBPETokenizer:
    """A transformers tokenizer encoding as zoo's tokenizer encodes.

    Args:
        tokenizer: a zoo CharTokenizer or BPETokenizer (e.g. a TextTransformer's `tokenizer`).
        name_or_path: recorded as the tokenizer's name_or_path; default "".
    """
    if isinstance(tokenizer, CharTokenizer):
        made = ZooCharTokenizer(tokenizer.chars, name_or_path=name_or_path)
    elif isinstance(tokenizer, BPETokenizer):
        made = ZooBPETokenizer(tokenizer_object=tokenizer.tokenizer, name_or_path=name_or_path)
    else:
        raise TypeError(f"from_zoo_tokenizer takes a zoo CharTokenizer or BPETokenizer, got {type(tokenizer).__name__}")
    return made


def register_with_transformers() -> None:
    """Register the config, the causal LM and the tokenizers with transformers' Auto classes (again is harmless),
    and zoo's attention functions with transformers' AttentionInterface where zoo has them."""
    AutoConfig.register(MODEL_TYPE, ZooTextConfig, exist_ok=True)
    AutoModelForCausalLM.register(ZooTextConfig, ZooTextForCausalLM, exist_ok=True)
    # both names are registered (a tokenizer saved by transformers names its class); config.tokenizer_class picks
    AutoTokenizer.register(ZooTextConfig, tokenizer_class=ZooCharTokenizer, exist_ok=True)
    AutoTokenizer.register(ZooTextConfig, tokenizer_class=ZooBPETokenizer, exist_ok=True)
    if importlib.util.find_spec("zoo.attention.hf_attention") is not None:  # asked now: it may be added later
        from zoo.attention.hf_attention import register_attention_functions

        register_attention_functions()


register_with_transformers()  # transformers is imported by now; the hook in transformers_hook.py may be first
