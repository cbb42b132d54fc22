"""QuantConfig: every knob of `compress quantize`, validated before any work starts."""

from dataclasses import dataclass, field

from compress.errors import UserError

METHODS = ("awq", "rtn", "int8", "fp8")
INT_METHODS = ("awq", "rtn")  # group-quantized int4/int3
OUTLIER_THRESHOLD = 6.0  # LLM.int8's |x| threshold
SMOOTH_ALPHA = 0.7  # int8 with one step per token: SmoothQuant migration strength on the norm-fed Linears
ACT_GROUPS = (32, 16)  # int8: x's steps per block of inputs, the first that divides every Linear (docs/formats.md)
FORMATS = ("compressed-tensors", "awq", "gguf")
ROUNDINGS = ("gptq", "nearest")  # awq, fp8: how weights meet their grid; default the first (awq --tune-iters: nearest)
ROUNDED_METHODS = ("awq", "fp8")  # the methods --rounding applies to
DTYPES = ("float32", "bfloat16", "float16")  # what unquantized tensors and scales are stored as
TUNE_DTYPES = ("float32", "bfloat16")  # awq --tune-iters: the dtype of the steps' matmuls


@dataclass
class QuantConfig:
    method: str = "awq"
    bits: int = 4
    group_size: int | None = None  # None: 128 if it divides every quantized Linear, else 64 or 32
    symmetric: bool = False
    format: str = "compressed-tensors"
    calib_data: str | None = None  # None: the C4 calibration file under $COMPRESS_DATA_DIR
    calib_samples: int = 128
    calib_seq_len: int = 512
    seed: int = 0
    grid: int = 20  # AWQ: scale exponents alpha in {0, 1/grid, ..., (grid-1)/grid}; range shrinks in steps of 1/grid
    clip_search: bool = True  # AWQ: search each group's grid (range and scale) after scaling
    tune_iters: int = 0  # awq: signed-gradient steps on each block's output after the searches (block_tune.py); 0 = none
    tune_dtype: str | None = None  # their matmuls: "float32" or "bfloat16"; None: bf16 where the hardware has it natively
    rounding: str | None = None  # awq, fp8: "gptq" (error feedback) or "nearest" (the paper's, the old fp8); None: gptq,
    # or nearest for awq with tune_iters
    # The search losses are measured on a sample of the calibration set; the statistics
    # (mean |x| per channel) use all of it. Attention needs whole sequences, the rest tokens.
    search_sequences: int = 8
    search_tokens: int = 4096
    outlier_threshold: float = OUTLIER_THRESHOLD  # int8: input dims whose calibration max |x| reaches this stay in fp16
    outlier_topk: int | None = None  # int8: instead, the K largest dims per Linear (0 = no split)
    static_activations: bool = False  # fp8: calibrated per-tensor input scales instead of per-token
    smooth_alpha: float | None = None  # int8: SmoothQuant strength, 0 = none; None: 0 with per-block steps, else 0.7
    act_group_size: int | None = None  # int8: x's steps per token and block of this many inputs; 0 = one step per
    # token; None: the first of ACT_GROUPS that divides every Linear's inputs (apply.int8_spec)
    dtype: str | None = None  # stored dtype of unquantized tensors and scales; None: the source checkpoint's
    gguf_type: str | None = None  # --format gguf: llama.cpp's file type; None: Q4_K_M for 4 bits, Q8_0 for int8
    ignore: list[str] = field(default_factory=list)  # Linears kept unquantized: full names or re:REGEX (ignore.py)

    def __post_init__(self):
        if self.method not in METHODS:
            raise UserError(f"--method {self.method} is not one of {', '.join(METHODS)}")
        if self.method in INT_METHODS and self.bits not in (3, 4):
            raise UserError(f"--bits {self.bits} is not supported for {self.method}: use 4 or 3")
        if self.format not in FORMATS:
            raise UserError(f"--format {self.format} is not one of {', '.join(FORMATS)}")
        if self.format == "awq" and (self.bits != 4 or self.symmetric or self.method not in INT_METHODS):
            raise UserError(
                "--format awq (AutoAWQ GEMM) holds asymmetric 4-bit weights only; "
                "use --format compressed-tensors for other bit widths and methods"
            )
        if self.dtype is not None and self.dtype not in DTYPES:
            raise UserError(f"--dtype {self.dtype} is not one of {', '.join(DTYPES)}")
        if self.format == "awq" and self.dtype not in (None, "float16"):
            raise UserError(f"--format awq (AutoAWQ GEMM) stores float16 scales and weights, not {self.dtype}; "
                            "drop --dtype or use --format compressed-tensors")
        if self.group_size is not None and self.group_size <= 0:
            raise UserError(f"--group-size must be positive, got {self.group_size}")
        if self.calib_samples <= 0 or self.calib_seq_len <= 1:
            raise UserError("--calib-samples must be > 0 and --calib-seq-len > 1")
        if self.search_sequences < 1 or self.search_tokens < 1:
            raise UserError("search_sequences and search_tokens must be at least 1")
        if self.grid < 1:
            raise UserError(f"grid must be at least 1, got {self.grid}")
        if self.rounding is not None and self.rounding not in ROUNDINGS:
            raise UserError(f"--rounding {self.rounding} is not one of {', '.join(ROUNDINGS)}")
        if self.rounding is not None and self.method not in ROUNDED_METHODS:
            raise UserError(f"--rounding applies to --method awq and fp8, not {self.method}")
        if self.method in ROUNDED_METHODS and self.rounding is None:
            # AWQ's tuning steps start from nearest rounding: from GPTQ's codes they end worse (docs/awq.md step 6)
            self.rounding = "nearest" if self.method == "awq" and self.tune_iters else ROUNDINGS[0]
        if self.tune_iters < 0:
            raise UserError(f"--tune-iters must be >= 0, got {self.tune_iters}")
        if self.tune_iters and self.method != "awq":
            raise UserError(f"--tune-iters applies to --method awq, not --method {self.method}")
        if self.tune_dtype is not None and self.tune_dtype not in TUNE_DTYPES:
            raise UserError(f"--tune-dtype {self.tune_dtype} is not one of {', '.join(TUNE_DTYPES)}")
        if self.tune_dtype is not None and not self.tune_iters:
            raise UserError("--tune-dtype sets the dtype of --tune-iters' steps: give --tune-iters N too, or drop it")
        self.ignore = list(self.ignore)  # the CLI gives a tuple
        if self.ignore and self.format == "gguf":
            raise UserError("--ignore keeps Linears in the source dtype; --format gguf cannot hold unquantized decoder "
                            "Linears (llama.cpp's file types set each tensor's type): use --format compressed-tensors or awq")
        from compress.quant.ignore import check_patterns

        check_patterns(self.ignore)
        self._check_int8_fp8()
        self._check_gguf()

    def _check_int8_fp8(self) -> None:
        if self.method not in INT_METHODS and (self.group_size is not None or self.symmetric):
            raise UserError(f"--group-size and --symmetric apply to awq and rtn; --method {self.method} has one scale per output row")
        if self.outlier_threshold <= 0:
            raise UserError(f"--outlier-threshold must be > 0, got {self.outlier_threshold}")
        if self.outlier_topk is not None and self.outlier_topk < 0:
            raise UserError(f"--outlier-topk must be >= 0, got {self.outlier_topk}")
        if self.method != "int8" and (self.outlier_topk is not None or self.outlier_threshold != OUTLIER_THRESHOLD):
            raise UserError(f"--outlier-threshold and --outlier-topk apply to --method int8, not {self.method}")
        if self.method != "int8" and (self.smooth_alpha is not None or self.act_group_size is not None):
            raise UserError(f"--smooth-alpha and --act-group-size apply to --method int8, not {self.method}")
        g = self.act_group_size
        if g and (g < 16 or g & (g - 1)):
            raise UserError(f"--act-group-size must be a power of two >= 16 (0: one step per token), got {g}")
        if self.method == "int8" and self.smooth_alpha is None:
            # smoothing helps one step per token; with steps per block it only coarsens the weights (docs/formats.md)
            self.smooth_alpha = SMOOTH_ALPHA if g == 0 else 0.0
        if self.smooth_alpha is not None and not 0 <= self.smooth_alpha <= 1:
            raise UserError(f"--smooth-alpha must be in [0, 1], got {self.smooth_alpha}")
        if self.static_activations and self.method != "fp8":
            raise UserError(f"--static-activations applies to --method fp8, not {self.method}")
        if self.method == "fp8":
            from compress.quant.fp8 import require_float8

            require_float8()

    def _check_gguf(self) -> None:
        from compress.gguf.types import DEFAULT_4BIT, DEFAULT_8BIT, FILE_TYPES

        if self.format != "gguf":
            if self.gguf_type is not None:
                raise UserError("--gguf-type applies to --format gguf")
            return
        if self.gguf_type is None:
            self.gguf_type = DEFAULT_8BIT if self.method == "int8" else DEFAULT_4BIT
        if self.gguf_type not in FILE_TYPES:
            raise UserError(f"--gguf-type {self.gguf_type} is not one of {', '.join(FILE_TYPES)}")
        ft = FILE_TYPES[self.gguf_type]
        if self.method == "fp8":
            raise UserError("--format gguf has no fp8 type; use --method awq or rtn (4-bit types) or int8 (Q8_0)")
        if ft.bits == 4 and (self.method not in INT_METHODS or self.bits != 4):
            what = f"--bits {self.bits}" if self.method in INT_METHODS else f"--method {self.method}"
            raise UserError(f"--gguf-type {ft.name} holds 4-bit weights; {what} does not fit it (use --method awq or rtn "
                            "with --bits 4, or --gguf-type Q8_0 for 8 bits)")
        if ft.bits == 8 and self.method == "awq":
            raise UserError("--gguf-type Q8_0 takes --method int8 or rtn (8-bit rounding needs no AWQ search)")
        if self.group_size is not None or self.symmetric or self.dtype is not None or self.act_group_size or self.smooth_alpha:
            raise UserError(f"--group-size, --symmetric, --dtype, --act-group-size and --smooth-alpha do not apply to --format "
                            f"gguf: {ft.name} fixes its own blocks, scales and dtypes, and llama.cpp rounds x itself")

    @property
    def gguf_calibrates(self) -> bool:
        from compress.gguf.types import FILE_TYPES

        return self.method == "awq" and FILE_TYPES[self.gguf_type].bits == 4

    @property
    def gptq(self) -> bool:
        """Whether AWQ's codes or fp8's e4m3 values are chosen by GPTQ's error feedback rather than nearest rounding."""
        return self.rounding == "gptq"

    @property
    def needs_calibration(self) -> bool:
        if self.format == "gguf":
            return self.gguf_calibrates
        if self.method == "int8":
            return self.outlier_topk != 0 or self.smooth_alpha > 0
        if self.method == "fp8":
            return self.static_activations or self.gptq  # GPTQ needs each Linear's input second moments
        return self.method == "awq"
