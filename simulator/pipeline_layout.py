"""Pipeline layouts: which pipeline stage holds the embedding, which decoder blocks, and the head.

A stage of a plan is one virtual pipeline stage (``pp x vp`` of them, in model order: stage ``i``
runs on pipeline rank ``i % pp`` under Megatron's interleaved schedule). Two ways to say how a
model's decoder blocks fall into them:

- **A layout string** (:func:`parse_layout`), Megatron-Core's ``--pipeline-model-parallel-layout``
  (``PipelineParallelLayerLayout.parse_str_to_list`` and ``validate_layer_layout``,
  ``megatron/core/transformer/pipeline_parallel_layer_layout.py`` in NVIDIA/Megatron-LM at
  0d8e0714cd29c01e164fe6de9f532182bdffa942, the Megatron-LM that Megatron-Bridge r0.2.0 /
  commit 08968b3 pins): ``E`` the embedding, ``t`` a decoder block, ``m`` a multi-token-prediction
  (MTP) layer, ``L`` the loss (the output head), ``|`` a stage boundary, ``(...)*N`` and ``x*N``
  repetition (no nesting), commas ignored; the stages listed in model (virtual-stage) order,
  ``pp x vp`` of them. Example, NVIDIA's DeepSeek-V3 H100 performance layout on pp 8 x vp 4
  (Megatron-Bridge ``scripts/performance/configs/deepseek/deepseek_llm_pretrain.py`` at 08968b3):
  ``Et|(tt|)*30mL``, 32 stages: the embedding and one block, thirty stages of two, then MTP and
  the loss alone.
- **The recipes' split** (:func:`recipe_split`) when no layout is given.

Errors are :class:`LayoutError` (a :class:`~simulator.plan_costs.CostError`), one line naming the
bad value and the fix.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from simulator.plan_costs import CostError


class LayoutError(CostError):
    """A malformed pipeline layout or an impossible split (the message names the value and fix)."""


LAYER_CHARS = {"E": "embedding", "t": "decoder block", "m": "MTP layer", "L": "loss/head"}
"""The layout's layer characters (Megatron-Core's ``char2layer_type``)."""

MAX_EXPANDED = 65536
"""Most layer characters a layout may expand to (far above any model: at most 128 blocks in the
sources); a larger repetition is refused before it is expanded."""

_GROUP = re.compile(r"\(([^()]+)\)\*(\d+)")
_SINGLE = re.compile(r"([EtmL|])\*(\d+)")
FIX = ("fix: E embedding, t decoder block, m MTP, L loss, '|' between stages, (..)*N or x*N "
       "to repeat, e.g. Et|(tt|)*30mL")


@dataclass(frozen=True, slots=True)
class StageLayers:
    """What one stage holds: the embedding, ``blocks`` decoder blocks, ``mtp`` MTP layers, the
    loss (head)."""

    embedding: bool
    blocks: int
    mtp: int
    loss: bool

    @property
    def empty(self) -> bool:
        return not (self.embedding or self.blocks or self.mtp or self.loss)


def _expand(text: str) -> str:
    """``text`` with its repetitions unrolled (groups first, then single characters, as
    Megatron-Core's ``parse_str_to_list``)."""
    def times(rx: re.Pattern[str], s: str) -> str:
        size = len(s)
        for m in rx.finditer(s):
            size += len(m.group(1)) * (int(m.group(2)) - 1) - (len(m.group(0)) - len(m.group(1)))
            if size > MAX_EXPANDED:
                raise LayoutError(f"pipeline_layout {text[:60]!r} expands to over {MAX_EXPANDED} "
                                  f"layers; fix the repetition counts")
        return rx.sub(lambda m: m.group(1) * int(m.group(2)), s)

    return times(_SINGLE, times(_GROUP, text))


def parse_layout(text: str) -> tuple[StageLayers, ...]:
    """The stages of a Megatron-Core layout string (grammar in the module docstring), in model
    order, checked for form: exactly one ``E``, first; exactly one ``L``, last; every ``m``
    after every ``t`` and in ``L``'s stage (the zoo costs a model's MTP with its head); no
    empty stage (Megatron-Core would build one holding nothing).

    Raises:
        LayoutError: a character that is not a layer, a repetition left over (nested or
            unbalanced parentheses, a count without ``*``), an expansion over
            :data:`MAX_EXPANDED`, or a layout breaking the rules above.
    """
    raw = text.strip()
    s = _expand(raw.replace(",", ""))
    bad = next((c for c in s if c not in LAYER_CHARS and c != "|"), None)
    if bad is not None:
        what = ("a repetition left over (nested or unbalanced parentheses, or a count "
                "without '*')" if bad in "()*0123456789" else "not a layer")
        raise LayoutError(f"pipeline_layout {raw[:60]!r}: {bad!r} is {what}; {FIX}")
    parts = s.split("|")
    flat = s.replace("|", "")
    if not re.fullmatch(r"Et*m*L", flat):
        if flat.count("E") != 1 or flat.count("L") != 1:
            why = (f"has {flat.count('E')} E and {flat.count('L')} L; fix: exactly one "
                   f"embedding E and one loss L")
        elif not flat.startswith("E") or not flat.endswith("L"):
            why = "must start with E (the embedding) and end with L (the loss); fix the layout"
        else:
            why = "places a decoder block (t) after an MTP layer (m); fix: every m after every t"
        raise LayoutError(f"pipeline_layout {raw[:60]!r} {why}")
    stages = tuple(StageLayers("E" in p, p.count("t"), p.count("m"), "L" in p) for p in parts)
    for i, st in enumerate(stages):
        if st.empty:
            raise LayoutError(f"pipeline_layout {raw[:60]!r}: stage {i} is empty; fix: give it a "
                              f"layer (t) or drop it and its '|'")
        if st.mtp and not st.loss:
            raise LayoutError(f"pipeline_layout {raw[:60]!r}: stage {i} holds MTP (m) without the "
                              f"loss L; fix: put m in L's stage (the model costs its MTP with "
                              f"the head)")
    return stages


def check_layout(stages: tuple[StageLayers, ...], text: str, pp: int, blocks: int,
                 vp: int | None = None) -> int:
    """The virtual stages per rank the layout makes (``len(stages) / pp``), after checking it
    against the run: ``pp`` divides its stage count (Megatron-Core: "pipeline_model_parallel_layout
    must be divisible by pipeline_model_parallel_size"), it holds ``blocks`` decoder blocks, and
    it agrees with a given ``vp``.

    Raises:
        LayoutError: any of those fails.
    """
    n, got = len(stages), sum(st.blocks for st in stages)
    if n % pp:
        raise LayoutError(f"pipeline_layout {text.strip()[:60]!r} has {n} stages, not a multiple "
                          f"of pp={pp}; fix the layout (pp x vp stages, '|' between them)")
    if got != blocks:
        raise LayoutError(f"pipeline_layout {text.strip()[:60]!r} has {got} decoder blocks (t), "
                          f"the model has {blocks}; fix the layout")
    if vp is not None and vp != n // pp:
        raise LayoutError(f"pipeline_layout {text.strip()[:60]!r} has {n} stages = pp {pp} x "
                          f"vp {n // pp}, but vp={vp}; fix vp (or leave it blank)")
    return n // pp


def recipe_split(blocks: int, stages: int) -> tuple[tuple[int, ...], str]:
    """(decoder blocks per stage in model order, the rule used): ``blocks`` over ``stages``
    virtual stages as NVIDIA's recipes split them when no layout is given; the first stage also
    holds the embedding, the last the head.

    1. ``blocks`` divisible by ``stages``: the same number on each ("even"; Megatron-LM's
       default, which requires it: ``get_num_layers_to_build``, ``megatron/core/transformer/
       transformer_block.py`` at 0d8e071).
    2. ``blocks + 2`` divisible: the embedding and the loss each count as one layer, so the first
       and last stages hold one block fewer ("embedding and loss counted": Megatron-Core's
       ``account_for_embedding_in_pipeline_split`` and ``account_for_loss_in_pipeline_split``,
       same function; Megatron-Bridge's Qwen3 MoE recipes set both,
       ``src/megatron/bridge/recipes/qwen/qwen3_moe.py`` at 08968b3, ``qwen3_235b_a22b_
       pretrain_config``: 94 blocks on pp 8 x vp 4 = 2, 3 x 30, 2). Qi et al.'s 22 = 3 x 8 - 2
       and 46-layer models (ICLR 2024) are this split, and so is every uneven row the
       validation CSV held before this rule (the extra blocks on the middle ranks).
    3. Otherwise each middle stage holds ``k = ceil(blocks / stages)``, the first as many as it
       can of what is left, the last the rest ("first stages full"): DeepSeek-V3's recipe
       (``src/megatron/bridge/recipes/deepseek/deepseek_v3.py`` at 08968b3, ``layout_map``: 61
       blocks on 4 stages 16, 16, 16, 13; on 8 stages 8 x 7, 5; on 16 stages 4 x 15, 1) and its
       H100 performance layout on 32 stages, ``Et|(tt|)*30mL`` (1, 2 x 30, 0).
    4. Where rule 3 would leave the last stage a negative remainder (fewer than ``k`` blocks for
       each middle stage: 22 blocks on 16 stages), as evenly as possible with the extra blocks on
       the middle stages ("as even as possible"): this project's own fallback, not a recipe's
       (Megatron-LM needs a layout there); the split it used per rank before.

    Raises:
        LayoutError: too few blocks for the stages (every stage but the first and last needs
            one: rule 3's remainder would be negative).
    """
    if stages <= 1:
        return (blocks,), "even"
    if blocks % stages == 0:
        return (blocks // stages,) * stages, "even"
    if (blocks + 2) % stages == 0 and blocks + 2 >= stages:
        k = (blocks + 2) // stages
        return (k - 1,) + (k,) * (stages - 2) + (k - 1,), "embedding and loss counted"
    k = -(-blocks // stages)
    rest = blocks - k * (stages - 2)
    if rest >= 0:
        first = min(k, rest)
        return (first,) + (k,) * (stages - 2) + (rest - first,), "first stages full"
    if blocks < stages - 2:
        raise LayoutError(f"{blocks} decoder blocks cannot fill {stages} pipeline stages (each "
                          f"stage but the first and last needs one); fix: fewer stages (vp), or "
                          f"give a pipeline_layout")
    base, extra = divmod(blocks, stages)
    counts = [base] * stages
    for s in sorted(range(stages), key=lambda s: (-min(s, stages - 1 - s), s))[:extra]:
        counts[s] += 1
    return tuple(counts), "as even as possible, the extra blocks in the middle"


def split_text(counts: tuple[int, ...]) -> str:
    """A split as a layout string (``E``/``L`` on the first/last stage; runs of equal stages as
    ``(...|)*N``), for a row's assumptions: e.g. ``Et*4|(t*4|)*14t|L``."""
    def stage(i: int, c: int) -> str:
        body = f"t*{c}" if c > 1 else "t" * c
        return ("E" if i == 0 else "") + body + ("L" if i == len(counts) - 1 else "")

    parts = [stage(i, c) for i, c in enumerate(counts)]
    out: list[str] = []
    i = 0
    while i < len(parts):
        j = i
        while j + 1 < len(parts) and parts[j + 1] == parts[i]:
            j += 1
        run = j - i + 1
        last = j == len(parts) - 1
        out.append(f"({parts[i]}|)*{run}" if run > 1 and not last else
                   "|".join(parts[i:j + 1]) if last else parts[i])
        if not (run > 1 and not last) and not last:
            out.append("|")
        i = j + 1
    return "".join(out)


def split_summary(counts: tuple[int, ...]) -> str:
    """Blocks per stage in model order, runs of equal stages written ``k x n`` (no ``|``, so the
    text sits in a Markdown table cell): ``(4,) * 15 + (1,)`` -> ``"4 x 15, 1"``."""
    out: list[str] = []
    i = 0
    while i < len(counts):
        j = i
        while j + 1 < len(counts) and counts[j + 1] == counts[i]:
            j += 1
        out.append(f"{counts[i]} x {j - i + 1}" if j > i else str(counts[i]))
        i = j + 1
    return ", ".join(out)
