"""ModelConfig (read from an HF config.json) and EngineConfig (the engine's knobs), validated."""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

SUPPORTED_ARCHITECTURES = ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM",
                           "Gemma3ForCausalLM")
WEIGHT_FORMATS = ("auto", "q4", "q8", "int8", "model")
LOGPROBS_MODES = ("raw_logprobs", "processed_logprobs")


class ConfigError(ValueError):
    """A config.json or engine setting that Metrale cannot serve."""


@dataclass(slots=True)
class ModelConfig:
    """The decoder's shape, from the HF `config.json` fields of the same names.

    Source: transformers' LlamaConfig / MistralConfig / Qwen2Config / Qwen3Config.
    `head_dim` defaults to hidden_size // num_attention_heads (Qwen3 sets it
    explicitly); `attention_bias` is true for Qwen2 (qkv bias); `qk_norm` is true
    for Qwen3 and Gemma 3 (an RMSNorm over each head of q and k before RoPE).

    Gemma 3 (transformers' Gemma3TextConfig): `layer_types` names each layer "sliding_attention"
    (attends only to the last `sliding_window` positions, itself included, with RoPE base
    `rope_local_theta`: config `rope_local_base_freq`, or rope_parameters["sliding_attention"]) or
    "full_attention" (rope_theta); when config.json has no layer_types, every
    `sliding_window_pattern`-th layer (6) is full. The attention scale is
    query_pre_attn_scalar ** -0.5; logits are capped by tanh at final_logit_softcapping when set.
    Other architectures leave these at their defaults (no window, head_dim ** -0.5).
    """

    architecture: str
    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: dict | None
    max_position_embeddings: int
    tie_word_embeddings: bool
    attention_bias: bool
    qk_norm: bool
    bos_token_id: int | None = None
    eos_token_ids: list[int] = field(default_factory=list)
    torch_dtype: str | None = None
    sliding_window: int | None = None
    layer_types: list[str] = field(default_factory=list)
    rope_local_theta: float | None = None
    query_pre_attn_scalar: float | None = None
    final_logit_softcapping: float | None = None
    hidden_activation: str = "silu"

    @property
    def attention_scale(self) -> float:
        """The factor q·k is multiplied by before the softmax."""
        return (self.query_pre_attn_scalar or self.head_dim) ** -0.5

    def is_sliding(self, layer: int) -> bool:
        """True when `layer` attends through the sliding window (a local layer)."""
        return bool(self.layer_types) and self.layer_types[layer] == "sliding_attention"

    def __post_init__(self):
        if self.architecture not in SUPPORTED_ARCHITECTURES:
            raise ConfigError(
                f"architecture {self.architecture!r} is not supported; supported: {', '.join(SUPPORTED_ARCHITECTURES)}"
            )
        if self.num_attention_heads % self.num_key_value_heads:
            raise ConfigError("num_attention_heads must be a multiple of num_key_value_heads")
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "head_dim"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"{name} must be positive")
        if self.layer_types and len(self.layer_types) != self.num_hidden_layers:
            raise ConfigError("layer_types must name every layer")
        if any(t not in ("sliding_attention", "full_attention") for t in self.layer_types):
            raise ConfigError("layer_types holds a kind other than sliding_attention / full_attention")
        if self.layer_types and "sliding_attention" in self.layer_types and not (self.sliding_window or 0) > 0:
            raise ConfigError("sliding_attention layers need a positive sliding_window")

    @classmethod
    def from_dict(cls, cfg: dict) -> "ModelConfig":
        """Build from a parsed config.json. Raises ConfigError on a missing or bad field."""
        archs = cfg.get("architectures") or []
        if not archs:
            raise ConfigError("config.json has no 'architectures'")
        arch = archs[0]
        if arch == "Gemma3ForCausalLM":
            try:
                return cls._gemma3(cfg)
            except (KeyError, TypeError, ValueError) as exc:
                if isinstance(exc, ConfigError):
                    raise
                raise ConfigError(f"config.json: {exc}") from exc
        try:
            n_heads = int(cfg["num_attention_heads"])
            hidden = int(cfg["hidden_size"])
            eos = cfg.get("eos_token_id")
            eos_ids = [eos] if isinstance(eos, int) else list(eos or [])
            model_type = cfg.get("model_type", "llama")
            # transformers >= 5 writes `rope_parameters` (rope_theta inside); older: rope_theta + rope_scaling.
            rope = cfg.get("rope_parameters") or {}
            rope_theta = rope.get("rope_theta", cfg.get("rope_theta", 10000.0))
            rope_scaling = cfg.get("rope_scaling") or (
                rope if rope.get("rope_type", "default") != "default" else None)
            return cls(
                architecture=arch,
                model_type=model_type,
                vocab_size=int(cfg["vocab_size"]),
                hidden_size=hidden,
                intermediate_size=int(cfg["intermediate_size"]),
                num_hidden_layers=int(cfg["num_hidden_layers"]),
                num_attention_heads=n_heads,
                num_key_value_heads=int(cfg.get("num_key_value_heads") or n_heads),
                head_dim=int(cfg.get("head_dim") or hidden // n_heads),
                rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
                rope_theta=float(rope_theta),
                rope_scaling=rope_scaling,
                max_position_embeddings=int(cfg.get("max_position_embeddings", 2048)),
                tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
                attention_bias=bool(cfg.get("attention_bias", arch == "Qwen2ForCausalLM")),
                qk_norm=arch == "Qwen3ForCausalLM",
                bos_token_id=cfg.get("bos_token_id"),
                eos_token_ids=[int(e) for e in eos_ids],
                torch_dtype=cfg.get("torch_dtype") or cfg.get("dtype"),
            )
        except KeyError as exc:
            raise ConfigError(f"config.json lacks {exc.args[0]!r}") from exc

    @classmethod
    def _gemma3(cls, cfg: dict) -> "ModelConfig":
        """Gemma3ForCausalLM's config.json (transformers' Gemma3TextConfig and its defaults)."""
        if cfg.get("attn_logit_softcapping") is not None:
            raise ConfigError("attn_logit_softcapping is not supported")
        if cfg.get("use_bidirectional_attention"):
            raise ConfigError("use_bidirectional_attention is not supported")
        activation = cfg.get("hidden_activation") or cfg.get("hidden_act") or "gelu_pytorch_tanh"
        if activation != "gelu_pytorch_tanh":
            raise ConfigError(f"hidden_activation {activation!r} is not supported for Gemma 3")
        layers = int(cfg["num_hidden_layers"])
        pattern = int(cfg.get("sliding_window_pattern") or 6)
        types = cfg.get("layer_types") or [
            "sliding_attention" if (i + 1) % pattern else "full_attention" for i in range(layers)]
        # transformers >= 5: rope_parameters per layer kind; older: rope_theta, rope_local_base_freq, rope_scaling.
        rope = cfg.get("rope_parameters") or {}
        full = dict(rope.get("full_attention") or {})
        local = dict(rope.get("sliding_attention") or {})
        theta = float(full.pop("rope_theta", cfg.get("rope_theta", 1_000_000.0)))
        local_theta = float(local.get("rope_theta", cfg.get("rope_local_base_freq", 10_000.0)))
        if local.get("rope_type", "default") != "default":
            raise ConfigError("rope scaling on sliding_attention layers is not supported")
        scaling = cfg.get("rope_scaling") or (full if full.get("rope_type", "default") != "default" else None)
        eos = cfg.get("eos_token_id", 1)
        n_heads = int(cfg.get("num_attention_heads", 8))
        softcap = cfg.get("final_logit_softcapping")
        window = cfg.get("sliding_window", 4096)
        return cls(
            architecture="Gemma3ForCausalLM", model_type=cfg.get("model_type", "gemma3_text"),
            vocab_size=int(cfg.get("vocab_size", 262_208)), hidden_size=int(cfg.get("hidden_size", 2304)),
            intermediate_size=int(cfg.get("intermediate_size", 9216)), num_hidden_layers=layers,
            num_attention_heads=n_heads, num_key_value_heads=int(cfg.get("num_key_value_heads") or 4),
            head_dim=int(cfg.get("head_dim") or 256), rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
            rope_theta=theta, rope_scaling=scaling,
            max_position_embeddings=int(cfg.get("max_position_embeddings", 131_072)),
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", True)),
            attention_bias=bool(cfg.get("attention_bias", False)), qk_norm=True,
            bos_token_id=cfg.get("bos_token_id", 2),
            eos_token_ids=[int(e) for e in ([eos] if isinstance(eos, int) else list(eos or []))],
            torch_dtype=cfg.get("torch_dtype") or cfg.get("dtype"),
            sliding_window=None if window is None else int(window), layer_types=list(types),
            rope_local_theta=local_theta,
            query_pre_attn_scalar=float(cfg.get("query_pre_attn_scalar", 256)),
            final_logit_softcapping=float(softcap) if softcap is not None else None,
            hidden_activation=activation)

    @classmethod
    def from_folder(cls, path: str | Path) -> "ModelConfig":
        """Read `<path>/config.json`. Raises ConfigError when it is missing or bad."""
        cfg_path = Path(path) / "config.json"
        if not cfg_path.is_file():
            raise ConfigError(f"{cfg_path} does not exist")
        try:
            cfg = json.loads(cfg_path.read_text())
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{cfg_path} is not valid JSON: {exc}") from exc
        return cls.from_dict(cfg)


@dataclass(slots=True)
class EngineConfig:
    """The engine's knobs.

    kv_cache_bytes: the KV pool's size in bytes (None: kv_cache_fraction of the
    device's available memory, and no more than max_num_seqs sequences of
    max_model_len tokens need). kv_cache_dtype: bfloat16 (the default on every device, so
    greedy output does not depend on the machine; half float32's bytes per token), float32 (the
    exact one: logits equal transformers'), float16, int8 (per token and KV head, a float32 scale:
    layers/kv_quant.py; about a quarter of float32's bytes), or "auto" (the model dtype).
    block_size in tokens.
    enable_prefix_caching: reuse full KV blocks across requests with the same salt.
    max_num_batched_tokens: the per-step token budget (decodes + prefill chunks).
    max_waiting_requests: how many requests may wait to run; past it AsyncEngine.submit raises
    EngineOverloaded (0: unbounded).
    max_loras: LoRA adapter slots resident at once (0: no adapters); max_lora_rank: the largest
    rank an adapter may have.
    speculative: auto | on | off, speculative decoding from prompt lookup and Predicted Outputs
    (speculative.py: "auto" drafts while it pays); speculative_draft_tokens: the most draft tokens
    per sequence and step; speculative_ngram_max / _min: the n-gram sizes prompt lookup matches;
    speculative_max_batch: in auto, no drafts while more sequences decode; speculative_min_acceptance:
    in auto, a sequence whose drafts are accepted less often pauses drafting.
    batch_max_num_seqs: how many low-priority (batch) sequences may run at once;
    batch_prefill_chunk: the most prompt tokens one of them prefills per step.
    window_pool: for a model with sliding-window layers beside full ones (Gemma 3), those layers keep
    only their window's blocks, in a pool of their own (hybrid_block_manager.py); False: every layer
    keeps every block (one pool, the window applied by masks alone).
    num_threads: the most threads a step uses (None: the CPUs the affinity mask and the cgroup's quota
    allow); adaptive_threads: each step's team is that cap less the cores other runnable tasks hold
    (core_share.ThreadTeam), so a busy neighbour does not stall every barrier. solo_step_tokens: a step
    that only prefills at most this many tokens runs on one thread (LLMEngine.solo_step; 0: never).
    """

    model_path: str
    dtype: str = "auto"  # float32 | bfloat16 | float16 | auto
    device: str = "auto"  # cpu | cuda | auto
    block_size: int = 16
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 512
    max_model_len: int | None = None
    kv_cache_bytes: int | None = None
    kv_cache_fraction: float = 0.05
    kv_cache_dtype: str = "bfloat16"
    enable_prefix_caching: bool = True
    # The linears' weight format (layers/linear.py, models/llama.set_weights): "auto" (a folder's
    # GGUF blocks as shipped, int8 activation blocks; a float folder: "int8"), "q4" (Q4 blocks,
    # a float checkpoint quantised to Q4_1 with its LM head in Q8_0), "q8" (Q8_0 blocks), "int8"
    # (per-channel int8, int16 activations), "model" (the folder's own values exactly: float
    # weights, or the shipped blocks with float32 activations). CPU kernels; CUDA runs float.
    weights: str = "auto"
    # Which weights prompt rows use: "same" (the `weights` format, one copy) or "model" (the
    # exact ones, kept beside the compact copy: prompt logits exactly the folder's).
    prefill_weights: str = "same"
    num_threads: int | None = None
    # The team follows the CPUs other runnable tasks leave (core_share.ThreadTeam); False: always the cap
    # (affinity, cgroup quota, num_threads).
    adaptive_threads: bool = True
    # A prefill-only step of at most this many tokens runs on one thread (LLMEngine's solo_step). SmolLM2's
    # fused step on the 2-vCPU AVX2 EPYC: one token 9.7 ms alone, 7.2 on two threads (14.4 ms of CPU);
    # each further token +3.4 ms alone, +1.7 on two: past two tokens the second thread saves more wall than
    # the CPU it adds.
    solo_step_tokens: int = 2
    # What logprobs report (vLLM's --logprobs-mode names): "raw_logprobs", the model's distribution (after a
    # structured output's mask, before logit_bias, penalties, temperature and truncation; vLLM's default, and
    # OpenAI's: a token's logprob does not move with the temperature), or "processed_logprobs", the
    # distribution the token was drawn from.
    logprobs_mode: str = "raw_logprobs"
    step_log: bool = False
    max_waiting_requests: int = 0
    max_loras: int = 4
    max_lora_rank: int = 64
    speculative: str = "auto"
    speculative_draft_tokens: int = 16
    speculative_ngram_max: int = 4
    speculative_ngram_min: int = 2
    speculative_max_batch: int = 8
    speculative_min_acceptance: float = 0.3

    def speculative_config(self):
        """The speculation knobs as a speculative.SpeculativeConfig. Raises ValueError on a bad value."""
        from .speculative import SpeculativeConfig

        return SpeculativeConfig(self.speculative, self.speculative_draft_tokens, self.speculative_ngram_max,
                                 self.speculative_ngram_min, self.speculative_max_batch,
                                 self.speculative_min_acceptance)
    batch_max_num_seqs: int = 4
    batch_prefill_chunk: int = 64
    window_pool: bool = True

    def __post_init__(self):
        if self.dtype not in ("auto", "float32", "bfloat16", "float16"):
            raise ConfigError(f"dtype must be auto, float32, bfloat16 or float16, got {self.dtype!r}")
        if self.device not in ("auto", "cpu", "cuda"):
            raise ConfigError(f"device must be auto, cpu or cuda, got {self.device!r}")
        if self.kv_cache_dtype not in ("auto", "float32", "bfloat16", "float16", "int8"):
            raise ConfigError(
                f"kv_cache_dtype must be auto, float32, bfloat16, float16 or int8, got {self.kv_cache_dtype!r}")
        if self.weights not in WEIGHT_FORMATS:
            raise ConfigError(f"weights must be one of {', '.join(WEIGHT_FORMATS)}, got {self.weights!r}")
        if self.prefill_weights not in ("same", "model"):
            raise ConfigError(f"prefill_weights must be same or model, got {self.prefill_weights!r}")
        if not 0 < self.kv_cache_fraction <= 1:
            raise ConfigError("kv_cache_fraction must be in (0, 1]")
        if self.block_size <= 0 or self.max_num_seqs <= 0 or self.max_num_batched_tokens <= 0:
            raise ConfigError("block_size, max_num_seqs and max_num_batched_tokens must be positive")
        if self.max_loras < 0 or self.max_lora_rank <= 0:
            raise ConfigError("max_loras must be >= 0 and max_lora_rank positive")
        if self.batch_max_num_seqs <= 0 or self.batch_prefill_chunk <= 0:
            raise ConfigError("batch_max_num_seqs and batch_prefill_chunk must be positive")
        if self.logprobs_mode not in LOGPROBS_MODES:
            raise ConfigError(f"logprobs_mode must be one of {', '.join(LOGPROBS_MODES)}, got {self.logprobs_mode!r}")
        if self.solo_step_tokens < 0:
            raise ConfigError("solo_step_tokens must be >= 0 (0: every step runs on the team)")
        if self.max_waiting_requests < 0:
            raise ConfigError("max_waiting_requests must be >= 0 (0: unbounded)")
        try:
            self.speculative_config()
        except ValueError as exc:
            raise ConfigError(str(exc)) from exc
