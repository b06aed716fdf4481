"""One table of a layer's packed tensors: what each is called in the Cell, in a converted file and in a
HuggingFace checkpoint, and how it is split over ranks. Loading, converting, quantizing and sharding all read it.
No MindSpore here.

Shape legend: H = hidden_size, I = the MLP's or an expert's intermediate size, E = experts, I_s = the shared
expert's; every name below is under the layer's prefix ``model.layers.{i}.{block}.``.

    kind            Cell parameter                       converted file                 HF tensors          split
    dense:
    gate_up         gate_up_proj.weight      [2I, H]     gate_up_proj.weight           gate_proj, up_proj  rows
    down            down_proj.weight         [H, I]      down_proj.weight              down_proj           columns
    MoE:
    router          router.weight            [E, H]      gate.weight                   gate.weight         replicated
    bias            router.e_score_correction_bias [E]   (the family's key)            (the same)          replicated
    gate_up         experts.gate_up_proj     [E, 2I, H]  experts.gate_up_proj.weight   experts.{e}.gate/up rows
    down            experts.down_proj        [E, H, I]   experts.down_proj.weight      experts.{e}.down    columns
    shared_gate_up  shared_expert.gate_up_proj.weight    {shared}gate_up_proj.weight   {shared}gate/up     rows
    shared_down     shared_expert.down_proj.weight       {shared}down_proj.weight      {shared}down        columns
    shared_gate     shared_expert_gate.weight [1, H]     (the family's key)            (the same)          replicated

A quantized tensor's other parts (its format's: scales, zero points, activation scales) are ``{kind}{suffix}`` /
``{name}{suffix}`` beside it and split with it by their axes (``ms_swiglu.quant.base.Part``): over experts
whole; with the rows in a ``rows`` split; in a ``columns`` split along their input axis by whole elements (a
group's scale, a byte of two int4 values), or refused; a part with neither axis replicated.
"""
import dataclasses
import enum

# A weight's other parts (its format's, ms_swiglu.quant) are named after it: {name}{suffix}
SCALE = "_scale"  # its scales
ZERO = "_zero"  # its zero points (asymmetric int4)
INPUT_SCALE, INPUT_OFFSET = "_input_scale", "_input_offset"  # its activations' static int8 scale and offset
PART_SUFFIXES = (SCALE, ZERO, INPUT_SCALE, INPUT_OFFSET)


class Split(enum.Enum):
    ROWS = "rows"  # packed [gate; up]: rank r holds [gate_r; up_r] (each part's r-th row block)
    COLUMNS = "columns"  # the inputs: rank r holds [:, r-th block]
    REPLICATED = "replicated"


@dataclasses.dataclass(frozen=True)
class TensorSpec:
    kind: str
    param: str  # the Cell's parameter name
    stored: str  # the full name in a converted file
    hf: tuple  # the full names of the HF tensors it is built from ({e}: each expert); two: packed [gate; up]
    hf_shape: tuple  # the shape of each of them
    split: Split
    size: int = 0  # the intermediate size a ROWS / COLUMNS split divides
    experts: int = 0  # stacked over this many experts (0: not stacked)
    quantized: bool = False  # weight formats quantize it
    float32: bool = False  # kept in float32 in a converted file, whatever its dtype


def _mlp(kind, param, stored, hf, hidden, inter, experts=0):
    """The two tensors of a SwiGLU MLP: packed gate/up (rows) and down (columns); ``hf``: gate, up, down names."""
    return (TensorSpec(kind + "gate_up", param + "gate_up_proj", stored + "gate_up_proj.weight", hf[:2],
                       (inter, hidden), Split.ROWS, inter, experts, quantized=True),
            TensorSpec(kind + "down", param + "down_proj", stored + "down_proj.weight", hf[2:], (hidden, inter),
                       Split.COLUMNS, inter, experts, quantized=True))


def layer_tensors(config, layer):
    """The :class:`TensorSpec` s of one layer of a model (a :class:`~ms_swiglu.families.base.ModelConfig`)."""
    keys, h = config.keys, config.hidden_size
    if not config.is_moe_layer(layer):
        p = keys.prefix(layer, "mlp")
        gate_up, down = _mlp("", "", p, [f"{p}{part}_proj.weight" for part in ("gate", "up", "down")], h,
                             config.intermediate_size)
        return (dataclasses.replace(gate_up, param="gate_up_proj.weight"),
                dataclasses.replace(down, param="down_proj.weight"))
    moe, p = config.moe, keys.prefix(layer)
    e = moe.num_experts
    specs = [TensorSpec("router", "router.weight", p + "gate.weight", (p + keys.router,), (e, h),
                        Split.REPLICATED)]
    if keys.bias:
        specs.append(TensorSpec("bias", "router.e_score_correction_bias", p + keys.bias, (p + keys.bias,), (e,),
                                Split.REPLICATED, float32=True))
    specs += _mlp("", "experts.", p + "experts.", [p + keys.expert.format(e="{e}", part=part) for part in keys.parts],
                  h, moe.intermediate_size, experts=e)
    if moe.shared_intermediate_size:
        s = p + keys.shared
        shared = _mlp("shared_", "shared_expert.", s, [f"{s}{part}_proj.weight" for part in ("gate", "up", "down")],
                      h, moe.shared_intermediate_size)
        specs += [dataclasses.replace(t, param=t.param + ".weight") for t in shared]
        if moe.shared_expert_gate:
            specs.append(TensorSpec("shared_gate", "shared_expert_gate.weight", p + keys.shared_gate,
                                    (p + keys.shared_gate,), (1, h), Split.REPLICATED))
    return tuple(specs)


# the Cell parameters (of an MLP, a MoE block, or their blocks) that weight formats quantize: the `quantized` rows
QUANTIZED_PARAMS = ("gate_up_proj.weight", "down_proj.weight", "experts.gate_up_proj", "experts.down_proj")


def stored_name(specs, kind):
    """The converted-file name of a layer's tensor (or scale) ``kind``."""
    weight = kind.removesuffix(SCALE)
    name = next(t.stored for t in specs if t.kind == weight)
    return name if weight == kind else name + SCALE
