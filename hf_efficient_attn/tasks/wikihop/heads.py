"""Candidate scoring: one score per answer candidate, read at the candidate's start marker, summed
over the chunks of a long input. This is the WikiHop model of Beltagy et al. 2020 ("Longformer",
section 6 and its appendix): question and candidates first, each candidate wrapped in ``[ent]`` ...
``[/ent]``, then the documents; a linear layer on the hidden state of each candidate's ``[ent]``
gives its score; inputs longer than the model's length are split into chunks that each repeat the
question and candidates, and the candidates' scores are summed over the chunks; cross-entropy over
the candidates.

``XxxForCandidateScoring`` (one class per supported architecture, built on that architecture's
``PreTrainedModel`` so its config class, weight initialisation and ``base_model_prefix`` are
Transformers' own) holds the encoder under the usual attribute (``bert``, ``roberta``, ...), so a
masked-LM or plain encoder checkpoint loads into it as into ``XxxForMultipleChoice``, and a
fine-tuned one saves and reloads with ``save_pretrained`` / ``from_pretrained``.
:class:`AutoModelForCandidateScoring` picks the class from the config and takes ``attn_impl=`` /
``attn_config=`` like ``hea.AutoModel*``: the efficient attention runs inside the encoder and is
restored from the saved config.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from transformers import PretrainedConfig, PreTrainedModel
from transformers.utils import ModelOutput

from ...integration.architectures import dispatch_refusal
from ...integration.auto import _EfficientAutoModel
from ...integration.patching import efficient_class, takes_pooling_layer_keyword, transformers_base_model_class
from ...integration.positions import max_tokens
from ...integration.transformers_private import build_from_config


@dataclass
class CandidateScoringOutput(ModelOutput):
    """``logits``: (batch, candidates) scores summed over each example's chunks; padded candidate
    slots hold the dtype's lowest value. ``loss``: mean cross-entropy over the examples (with ``labels``)."""

    loss: torch.Tensor | None = None
    logits: torch.Tensor | None = None


class CandidateScoringMixin:
    """The encoder, the scoring layer and the chunked forward pass shared by every architecture."""

    #: The encoder class of the architecture (set by each concrete class).
    encoder_class: type[PreTrainedModel]

    def __init__(self, config: PretrainedConfig) -> None:
        super().__init__(config)
        pooling = {"add_pooling_layer": False} if takes_pooling_layer_keyword(self.encoder_class) else {}
        setattr(self, self.base_model_prefix, self.encoder_class(config, **pooling))
        self.dropout = nn.Dropout(head_dropout(config))
        # No bias: a score shared by every candidate cancels in the softmax over candidates.
        self.candidate_scorer = nn.Linear(config.hidden_size, 1, bias=False)
        self.post_init()

    def forward(
        self,
        input_ids: torch.Tensor,
        candidate_positions: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        chunk_mask: torch.Tensor | None = None,
        candidate_mask: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        example_of_chunk: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        cu_seq_lens_q: torch.Tensor | None = None,
        cu_seq_lens_k: torch.Tensor | None = None,
        max_length_q: int | None = None,
        max_length_k: int | None = None,
    ) -> CandidateScoringOutput:
        """Score every candidate of every example.

        Padded (``ChunkCollator``):

        - ``input_ids``, ``attention_mask``, ``token_type_ids``: (batch, chunks, length), each chunk
          a complete input (question and candidates, then a slice of the documents).
        - ``chunk_mask``: (batch, chunks), True for the chunks an example has (default: all).

        Packed (``PackedChunkCollator``, ``--padding_free``): every chunk of the batch one after another
        in one row; ``input_ids`` and ``token_type_ids`` (1, tokens), ``position_ids`` restarting at
        every chunk, ``cu_seq_lens_q`` (chunks + 1,) where each chunk starts (and ``max_length_q``, the
        ``_k`` twins: the keywords of ``DataCollatorWithFlattening(return_flash_attn_kwargs=True)``,
        passed to the encoder, whose attention keeps the chunks apart), ``example_of_chunk``
        (chunks,), the example of each chunk.

        Both forms:

        - ``candidate_positions``: (batch, candidates), the position of each candidate's start marker,
          the same in every chunk of the example; ``candidate_mask``: True for real candidates.
        - ``labels``: (batch,), the index of the right candidate.

        Only the existing chunks are encoded (one batch of chunks, or the packed row); each chunk
        scores every candidate with ``candidate_scorer`` on the marker's hidden state, and an example's
        scores are the sums over its chunks. There is no ``**kwargs``: Trainer passes
        ``num_items_in_batch`` to a forward that takes them and then treats the model's loss as
        normalised by it.
        """
        batch = candidate_positions.shape[0]
        if example_of_chunk is not None:
            markers = self._packed_markers(
                input_ids, candidate_positions, example_of_chunk, attention_mask, token_type_ids, position_ids,
                cu_seq_lens_q, cu_seq_lens_k, max_length_q, max_length_k,
            )  # fmt: skip
        else:
            markers, example_of_chunk = self._padded_markers(
                input_ids, candidate_positions, attention_mask, token_type_ids, chunk_mask
            )
        chunk_scores = self.candidate_scorer(self.dropout(markers)).squeeze(-1)  # (n, candidates)
        logits = chunk_scores.new_zeros(batch, chunk_scores.shape[-1]).index_add(0, example_of_chunk, chunk_scores)
        if candidate_mask is not None:
            logits = logits.masked_fill(~candidate_mask.bool(), torch.finfo(logits.dtype).min)

        loss = F.cross_entropy(logits.float(), labels) if labels is not None else None
        return CandidateScoringOutput(loss=loss, logits=logits)

    def _check_chunk_length(self, length: int) -> None:
        if length > max_tokens(self.config):
            raise ValueError(f"chunks of {length} tokens exceed the position table ({max_tokens(self.config)} tokens allowed)")

    def _padded_markers(
        self,
        input_ids: torch.Tensor,
        candidate_positions: torch.Tensor,
        attention_mask: torch.Tensor | None,
        token_type_ids: torch.Tensor | None,
        chunk_mask: torch.Tensor | None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The hidden states at the candidate markers of every existing chunk (n, candidates, hidden),
        and the example of each chunk (n,)."""
        if input_ids.dim() != 3:
            raise ValueError(
                f"input_ids must be (batch, chunks, length), or one packed row (1, tokens) with example_of_chunk; "
                f"got shape {tuple(input_ids.shape)}"
            )
        batch, chunks, length = input_ids.shape
        self._check_chunk_length(length)
        if chunk_mask is None:
            chunk_mask = torch.ones(batch, chunks, dtype=torch.bool, device=input_ids.device)
        chunk_mask = chunk_mask.bool()
        example_of_chunk = torch.arange(batch, device=input_ids.device)[:, None].expand(batch, chunks)[chunk_mask]

        def existing(tensor: torch.Tensor | None) -> torch.Tensor | None:
            return None if tensor is None else tensor[chunk_mask]  # (chunks of the batch, length)

        encoder_inputs = {"input_ids": existing(input_ids), "attention_mask": existing(attention_mask)}
        if token_type_ids is not None:
            encoder_inputs["token_type_ids"] = existing(token_type_ids)
        hidden = self.base_model(**encoder_inputs).last_hidden_state  # (n, length, hidden)
        positions = candidate_positions[example_of_chunk]  # (n, candidates)
        return hidden.gather(1, positions[..., None].expand(-1, -1, hidden.shape[-1])), example_of_chunk

    def _packed_markers(
        self,
        input_ids: torch.Tensor,
        candidate_positions: torch.Tensor,
        example_of_chunk: torch.Tensor,
        attention_mask: torch.Tensor | None,
        token_type_ids: torch.Tensor | None,
        position_ids: torch.Tensor | None,
        cu_seq_lens_q: torch.Tensor | None,
        cu_seq_lens_k: torch.Tensor | None,
        max_length_q: int | None,
        max_length_k: int | None,
    ) -> torch.Tensor:
        """The hidden states at the candidate markers of every chunk of the packed row (n, candidates,
        hidden): chunk start + marker position in the row's hidden states."""
        if input_ids.dim() != 2 or input_ids.shape[0] != 1 or cu_seq_lens_q is None or position_ids is None:
            raise ValueError(
                "packed chunks (example_of_chunk given) need input_ids of one row (1, tokens), position_ids and "
                f"cu_seq_lens_q (PackedChunkCollator); got input_ids of shape {tuple(input_ids.shape)}, position_ids "
                f"{'given' if position_ids is not None else 'None'}, cu_seq_lens_q "
                f"{'given' if cu_seq_lens_q is not None else 'None'}"
            )
        starts = cu_seq_lens_q[:-1].long()
        if len(starts) != len(example_of_chunk):
            raise ValueError(f"{len(starts)} chunks in cu_seq_lens_q, {len(example_of_chunk)} in example_of_chunk")
        if max_length_q is not None:  # the longest chunk (an int from the collator: no device sync)
            self._check_chunk_length(int(max_length_q))
        hidden = self.base_model(
            input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids,
            position_ids=position_ids, cu_seq_lens_q=cu_seq_lens_q, cu_seq_lens_k=cu_seq_lens_k,
            max_length_q=max_length_q, max_length_k=max_length_k,
        )  # fmt: skip
        hidden = hidden.last_hidden_state[0]  # (tokens, hidden)
        return hidden[starts[:, None] + candidate_positions[example_of_chunk]]  # (n, candidates, hidden)


#: The config fields that set a classification head's dropout, in the order the architectures' own
#: heads read them (ALBERT's and DistilBERT's own names; BERT's falls back to its hidden layers').
HEAD_DROPOUT_FIELDS = ("classifier_dropout", "classifier_dropout_prob", "seq_classif_dropout", "hidden_dropout_prob")


def head_dropout(config: PretrainedConfig) -> float:
    """The scorer's dropout, as the architecture's own sequence classifier sets its head's: the first
    of ``HEAD_DROPOUT_FIELDS`` the config sets, else none (EuroBERT's head has none)."""
    for name in HEAD_DROPOUT_FIELDS:
        if getattr(config, name, None) is not None:
            return getattr(config, name)
    return 0.0


def candidate_scoring_class(config: PretrainedConfig) -> type[PreTrainedModel]:
    """``XxxForCandidateScoring`` of ``config``'s architecture: the mixin on the ``XxxPreTrainedModel``
    of its encoder (``XxxModel``, Transformers' base model of the config), named after
    it. ``ValueError`` for an architecture this package cannot patch."""
    refusal = dispatch_refusal(config, getattr(config, "attn_impl", None) or "any")
    if refusal is not None:
        raise ValueError(refusal)
    return _candidate_scoring_class(transformers_base_model_class(config))  # one exists: the architecture dispatches


@functools.cache
def _candidate_scoring_class(encoder_class: type[PreTrainedModel]) -> type[PreTrainedModel]:
    pretrained_class = next(c for c in encoder_class.__mro__[1:] if issubclass(c, PreTrainedModel))
    name = encoder_class.__name__.removesuffix("Model") + "ForCandidateScoring"
    return type(name, (CandidateScoringMixin, pretrained_class), {"encoder_class": encoder_class, "__module__": __name__})


class _CandidateScoringLoader:
    """What ``_EfficientAutoModel`` delegates to (a Transformers auto class elsewhere; Transformers
    has none for this head): the efficient subclass of the config's candidate-scoring class."""

    @staticmethod
    def model_class(config: PretrainedConfig) -> type[PreTrainedModel]:
        return efficient_class(candidate_scoring_class(config))

    @classmethod
    def from_pretrained(cls, path: str, *args: Any, config: PretrainedConfig, **kwargs: Any) -> PreTrainedModel:
        return cls.model_class(config).from_pretrained(path, *args, config=config, **kwargs)

    @classmethod
    def from_config(cls, config: PretrainedConfig, **kwargs: Any) -> PreTrainedModel:
        return build_from_config(cls.model_class(config), config, **kwargs)


class AutoModelForCandidateScoring(_EfficientAutoModel):
    """``XxxForCandidateScoring`` for the config's architecture, with ``attn_impl=`` /
    ``attn_config=`` (the rules of ``hea.AutoModel*``)::

        model = AutoModelForCandidateScoring.from_pretrained("outputs/roberta-base-4096-mra2")
        model.save_pretrained("scorer")  # reloads with the same method and scorer
    """

    _auto_class = _CandidateScoringLoader
