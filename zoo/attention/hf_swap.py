"""swap for Hugging Face transformers' attention modules: micro, elita, incontext, gla, deltanet and ssd in their place.

These read the layer's hidden states, not q, k and v alone, so they cannot be attention
functions (hf_attention.py); swap replaces the whole module instead. It replaces self-attention written in
one of transformers' two layouts:

    q_proj, k_proj, v_proj, o_proj (nn.Linear)   LlamaAttention, MistralAttention, Qwen2Attention, ViTAttention, ...
    c_attn, c_proj (GPT-2's Conv1D)              GPT2Attention (self-attention, not its cross-attention)

with `TransformersAttention`, which is called as the old module was (hidden states first, the model's mask
and cache by keyword) and returns (output, None). The model's own modules stay where a weight is kept, under
the model's own names: the output projection (o_proj or c_proj) always, and for incontext q, k and v too
(q_proj, k_proj, v_proj or c_attn) where they have one head per query head; the mechanism's new weights sit
under `mixer.` (e.g. `model.layers.0.self_attn.mixer.queries`). So the state_dict of a model swapped to
incontext loads the original checkpoint's kept weights by their original keys.

Decoding: with a cache (generate's DynamicCache), a causal layer keeps its zoo state (MicroState, ElitaState,
InContextState, RecurrentState) on the cache object, under `cache.zoo_states[layer_idx]`, and writes a one-channel
placeholder per token into the cache's layer, so that the cache's length (which the model's positions and masks read)
counts the tokens as it does for softmax layers. Beam search, which reorders the cache, is not supported.

Save and load: transformers' `save_pretrained` writes the swapped model's state_dict and the swap itself
(config.zoo_swap). Loading that folder with the original class (`GPT2LMHeadModel.from_pretrained`) would
rebuild plain attention and silently drop the new weights, so the saved config asks for an attention
implementation named after the swap ("zoo_swapped_micro"), which nothing registers: transformers refuses to
load it, naming it. `zoo.attention.load_swapped(GPT2LMHeadModel, path)` loads the folder as the swapped
model, with the same outputs.
"""

from __future__ import annotations

import inspect
import json

import torch
from torch import nn

from zoo.attention.deltanet import DeltaNetAttention
from zoo.attention.elita import ElitaAttention
from zoo.attention.gla import GatedLinearAttention
from zoo.attention.incontext import InContextAttention
from zoo.attention.micro import MicroAttention
from zoo.attention.ssd import SSDAttention
from zoo.utils.checks import shown

# What swap puts in place of a transformers attention module
HF_MIXERS: dict[str, type[nn.Module]] = {"micro": MicroAttention, "elita": ElitaAttention,
                                          "incontext": InContextAttention, "gla": GatedLinearAttention,
                                          "deltanet": DeltaNetAttention, "ssd": SSDAttention}
CAUSAL_ONLY = (ElitaAttention, GatedLinearAttention, DeltaNetAttention, SSDAttention)
LAYOUTS = {"qkvo": ("q_proj", "k_proj", "v_proj", "o_proj"), "gpt2": ("c_attn", "c_proj")}
SUPPORTED = ("self-attention with q_proj, k_proj, v_proj and o_proj (LlamaAttention, MistralAttention, "
             "Qwen2Attention, ViTAttention, ...) or GPT-2's c_attn and c_proj (GPT2Attention)")


def is_transformers_attention(module: nn.Module) -> bool:
    """Whether `module` is one of transformers' attention classes (defined in transformers, named *Attention).

    Args:
        module: any module.
    """
    cls = type(module)
    return cls.__module__.startswith("transformers.") and cls.__name__.endswith("Attention")


def _layout(old: nn.Module) -> str | None:
    if all(isinstance(getattr(old, part, None), nn.Linear) for part in LAYOUTS["qkvo"]):
        return "qkvo"
    if all(type(getattr(old, part, None)).__name__ == "Conv1D" for part in LAYOUTS["gpt2"]) \
            and not getattr(old, "is_cross_attention", False):
        return "gpt2"
    return None


def _refusal(old: nn.Module, name: str, why: str) -> ValueError:
    cls = type(old)
    return ValueError(f"swap: {name or 'the model'} is transformers' {cls.__name__} ({cls.__module__}), {why}; "
                      f"swap replaces {SUPPORTED} with {', '.join(HF_MIXERS)}")


def check_transformers_mechanism(old: nn.Module, name: str, mechanism: str) -> None:
    """Refuse, in one line, a mechanism swap cannot put in place of a transformers attention module: the
    softmax family goes through attn_implementation instead (hf_attention.py).

    Args:
        old: the transformers attention module.
        name: its qualified name in the model.
        mechanism: the mechanism asked for.
    """
    if mechanism in HF_MIXERS:
        return
    keyword = {"softmax": "sdpa", "quiet": "zoo_quiet", "clipped": "zoo_clipped"}.get(mechanism)
    if keyword:
        raise _refusal(old, name, f"whose q, k and v go through transformers' attention functions: for {mechanism} "
                                  f"pass attn_implementation={keyword!r} (zoo.attention.register_attention_functions)"
                                  " instead of swapping")
    raise _refusal(old, name, f"and {mechanism} needs weights of its own that this layer has no place for")


def _geometry(old: nn.Module, name: str, layout: str) -> tuple[int, int, int]:
    """(dim, heads, kv_heads) of a transformers attention module, refused where heads x head_dim != dim."""
    config = getattr(old, "config", None)
    if layout == "gpt2":
        dim, heads = old.embed_dim, old.num_heads
        kv_heads = heads
    else:
        dim = old.q_proj.in_features
        heads = getattr(config, "num_attention_heads", None) or getattr(old, "num_heads", None)
        head_dim = getattr(old, "head_dim", None)
        if not heads or not head_dim:
            raise _refusal(old, name, "and its number of heads or head width is not to be found (config."
                                      "num_attention_heads, head_dim)")
        if old.q_proj.out_features != heads * head_dim or old.o_proj.in_features != heads * head_dim \
                or heads * head_dim != dim or old.o_proj.out_features != dim:
            raise _refusal(old, name, f"whose {heads} heads of width {head_dim} are not its hidden size {dim} "
                                      f"(q_proj {dim} -> {old.q_proj.out_features}, o_proj {old.o_proj.in_features} "
                                      f"-> {old.o_proj.out_features}); zoo's layers need heads x head width = hidden "
                                      "size")
        kv_heads = old.k_proj.out_features // head_dim
    return dim, heads, kv_heads


def transformers_replacement(old: nn.Module, name: str, mechanism: str, options: dict
                             ) -> tuple[nn.Module, bool, list[str], list[str]]:
    """The TransformersAttention to put in place of transformers' attention module `old`, whether it kept q, k
    and v, notes for swap's log, and what it drops that would change the outputs (swap refuses those unless
    strict=False).

    Args:
        old: the transformers attention module.
        name: its qualified name in the model.
        mechanism: micro, elita, incontext, gla, deltanet or ssd.
        options: arguments for the mechanism's class; heads and causal default to the old module's.
    """
    check_transformers_mechanism(old, name, mechanism)
    layout = _layout(old)
    if layout is None:
        raise _refusal(old, name, "whose projections are neither q_proj, k_proj, v_proj and o_proj (nn.Linear) nor "
                                  "GPT-2's c_attn and c_proj (its self-attention)")
    dim, heads, kv_heads = _geometry(old, name, layout)
    config = getattr(old, "config", None)
    causal = bool(getattr(old, "is_causal", False))
    cls = HF_MIXERS[mechanism]
    args = {"dim": dim, "heads": heads, "causal": causal, **options}
    if issubclass(cls, CAUSAL_ONLY) and not args["causal"]:
        raise ValueError(f"swap: {mechanism} is causal only and {name or 'the model'} attends both ways; pass "
                         "causal=True to swap it in anyway (each token then sees only those before it)")
    if cls is SSDAttention:  # its output goes through the model's o_proj, which takes the hidden size
        if args.setdefault("expand", 1) != 1:
            raise ValueError(f"swap: ssd in place of transformers' attention needs expand=1 (the model's output "
                             f"projection takes {dim} channels), got expand={shown(args['expand'])}")
    notes, lost = [], []
    keep_qkv = cls is InContextAttention and kv_heads == heads
    if cls is InContextAttention and not keep_qkv:
        notes.append(f"its k_proj and v_proj have {kv_heads} heads for {heads} queries (grouped): fresh q, k, v")
    if keep_qkv:
        if any(not isinstance(getattr(old, part, None), (nn.Identity, type(None))) for part in ("q_norm", "k_norm")):
            lost.append("its q_norm and k_norm")
        scaling = getattr(old, "scaling", None)
        if scaling is not None and abs(scaling - (dim // heads) ** -0.5) > 1e-12:
            lost.append(f"its logit scaling {scaling:g} (incontext scales by 1/sqrt(head width))")
        args.setdefault("bias", any(getattr(getattr(old, part), "bias", None) is not None
                                    for part in LAYOUTS[layout][:-1]))
        dropout = getattr(old, "attention_dropout", None)
        dropout = old.attn_dropout.p if dropout is None and hasattr(old, "attn_dropout") else dropout
        args.setdefault("dropout", float(dropout or 0.0))
    if getattr(config, "sliding_window", None) and getattr(config, "use_sliding_window", True):
        lost.append(f"its sliding window of {config.sliding_window} tokens ({mechanism} sees every earlier token)")
    if layout == "qkvo" and (getattr(config, "rope_parameters", None) or getattr(config, "rope_theta", None)):
        notes.append("the model's rotary positions are not applied (zoo's layer has its own sense of order)")
    if not keep_qkv:  # swap's warning about fresh weights reads the first note
        notes.insert(0, f"{cls.__name__} has no q, k, v of the model's shapes; the output projection is kept")
    mixer = (_InContextOnProjections if keep_qkv else cls)(**args)
    param = next(old.parameters(), None)
    if param is not None:
        mixer = mixer.to(device=param.device, dtype=param.dtype)
    new = TransformersAttention(mixer, old, layout, keep_qkv)
    new.train(old.training)
    return new, keep_qkv, notes, lost


class _InContextOnProjections(InContextAttention):
    """InContextAttention whose q, k and v come from the replaced layer's own projections (TransformersAttention
    sets `project`), so that they keep the model's names and checkpoints."""

    def __init__(self, dim: int, heads: int = 1, **kwargs):
        super().__init__(dim, heads=heads, **kwargs)
        del self.qkv  # the replaced layer's q_proj, k_proj, v_proj (or c_attn) take its place
        self.project = None

    def _split_heads(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return self.project(x)


class TransformersAttention(nn.Module):
    """A zoo layer in the place of a transformers attention module (see the module's docstring).

    `forward(hidden_states, ...)` takes what the old module took (the model's attention mask and cache by
    their names; the rest, such as rotary position embeddings, is not read) and returns (output, None): the
    zoo layer's output through the model's own output projection.

    Args:
        mixer: the zoo layer (MicroAttention, ElitaAttention, InContextAttention, GatedLinearAttention,
            DeltaNetAttention or SSDAttention); its own output projection
            is replaced by the old module's.
        old: the transformers attention module it replaces.
        layout: "qkvo" (q_proj, k_proj, v_proj, o_proj) or "gpt2" (c_attn, c_proj).
        keep_qkv: whether the mixer takes q, k and v from the old module's projections (incontext).
    """

    def __init__(self, mixer: nn.Module, old: nn.Module, layout: str, keep_qkv: bool = False):
        super().__init__()
        if layout not in LAYOUTS:
            raise ValueError(f"TransformersAttention expects layout as one of {list(LAYOUTS)}, got {shown(layout)}")
        self.layout, self.dim, self.heads = layout, mixer.dim, mixer.heads
        self.layer_idx = getattr(old, "layer_idx", None)
        self.is_causal = mixer.causal
        self.replaced = type(old).__name__
        parts = LAYOUTS[layout] if keep_qkv else LAYOUTS[layout][-1:]
        for part in parts:  # the model's own modules, under the model's own names
            setattr(self, part, getattr(old, part))
        self.resid_dropout = getattr(old, "resid_dropout", nn.Identity())
        if hasattr(mixer, "proj"):
            mixer.proj = nn.Identity()  # the model's output projection follows
        if keep_qkv:
            mixer.project = self._project
        self.mixer = mixer
        # the old forward's positional parameters after hidden_states (ViT passes its mask second, by position)
        signature = inspect.signature(type(old).forward)
        self.positional = [p.name for p in list(signature.parameters.values())[2:]
                           if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]

    def _project(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        b, n, _ = x.shape
        if self.layout == "gpt2":
            q, k, v = self.c_attn(x).split(self.dim, dim=-1)
        else:
            q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
        return tuple(t.view(b, n, self.heads, -1).transpose(1, 2) for t in (q, k, v))

    def _output(self, out: torch.Tensor) -> torch.Tensor:
        projection = self.c_proj if self.layout == "gpt2" else self.o_proj
        return self.resid_dropout(projection(out))

    @staticmethod
    def _real_tokens(mask, length: int) -> torch.Tensor | None:
        """(batch, length) True for the real ones among the last `length` keys of the model's mask (bool, or
        eager's additive one): a key no query may see is padding. None: no mask, every token is real."""
        if mask is None:
            return None
        if not isinstance(mask, torch.Tensor) or mask.dim() != 4:
            raise ValueError(f"TransformersAttention expects the model's attention mask as a 4-D tensor (batch, 1, "
                             f"queries, keys) or None, got {type(mask).__name__}: use attn_implementation 'sdpa' or "
                             "'eager' for the model's other layers")
        allowed = mask if mask.dtype == torch.bool else mask > torch.finfo(mask.dtype).min / 2
        real = allowed.any(1).any(1)[:, -length:]
        return None if bool(real.all()) else real

    def forward(self, hidden_states: torch.Tensor, *args, **kwargs) -> tuple[torch.Tensor, None]:
        kwargs.update(zip(self.positional, args))
        cache = kwargs.get("cache", kwargs.get("past_key_values"))
        real = self._real_tokens(kwargs.get("attention_mask"), hidden_states.shape[1])
        if cache is None or not self.mixer.causal:
            return self._output(self.mixer(hidden_states, real)), None
        states = cache.__dict__.setdefault("zoo_states", {})
        slot = self.layer_idx if self.layer_idx is not None else id(self)
        first = cache.get_seq_length(self.layer_idx or 0) == 0
        out, states[slot] = self.mixer.step(hidden_states, None if first else states.get(slot), real)
        # one channel per token in the cache's layer: its length, which the model's positions and masks read
        b, n = hidden_states.shape[:2]
        placeholder = hidden_states.new_zeros(b, 1, n, 1)
        cache.update(placeholder, placeholder, self.layer_idx or 0)
        return self._output(out), None


def record_transformers_swap(model: nn.Module, swapped: list[str], mechanism: str, options: dict) -> None:
    """Write the swap into a transformers model's config (zoo_swap), so that save_pretrained carries it, and ask
    for an attention implementation named after it, which the original class's loading cannot honour.

    Args:
        model: the swapped model (anything with a transformers `config`; others are left alone).
        swapped: the qualified names of the replaced modules.
        mechanism: the mechanism swapped in.
        options: the options it was built with (JSON-able ones are recorded).
    """
    config = getattr(model, "config", None)
    if config is None or not hasattr(config, "to_json_string"):
        return
    earlier = getattr(config, "zoo_swap", None) or {}
    record = {"mechanism": mechanism, "options": json.loads(json.dumps(options, default=str)),
              "modules": sorted({*earlier.get("modules", []), *swapped}),
              "attn_implementation": earlier.get("attn_implementation", config._attn_implementation)}
    config.zoo_swap = record
    # a plain attribute: transformers writes it to config.json, and reads it back as the model's implementation
    config.__dict__["attn_implementation"] = f"zoo_swapped_{mechanism}"
