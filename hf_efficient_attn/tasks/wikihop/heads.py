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

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from transformers import (
    BertModel,
    BertPreTrainedModel,
    CamembertModel,
    CamembertPreTrainedModel,
    ElectraModel,
    ElectraPreTrainedModel,
    LongformerModel,
    LongformerPreTrainedModel,
    PretrainedConfig,
    PreTrainedModel,
    RobertaModel,
    RobertaPreTrainedModel,
    XLMRobertaModel,
    XLMRobertaPreTrainedModel,
)
from transformers.utils import ModelOutput

from ...integration.auto import _EfficientAutoModel
from ...integration.patching import efficient_class
from ...integration.positions import max_tokens


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
        pooling = {"add_pooling_layer": False} if self.encoder_class is not ElectraModel else {}  # ELECTRA has none
        setattr(self, self.base_model_prefix, self.encoder_class(config, **pooling))
        self.dropout = nn.Dropout(config.hidden_dropout_prob)
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
    ) -> CandidateScoringOutput:
        """Score every candidate of every example.

        - ``input_ids``, ``attention_mask``, ``token_type_ids``: (batch, chunks, length), each chunk
          a complete input (question and candidates, then a slice of the documents).
        - ``chunk_mask``: (batch, chunks), True for the chunks an example has (default: all).
        - ``candidate_positions``: (batch, candidates), the position of each candidate's start marker,
          the same in every chunk of the example; ``candidate_mask``: True for real candidates.
        - ``labels``: (batch,), the index of the right candidate.

        Only the existing chunks are encoded (one batch of chunks); each chunk scores every candidate
        with ``candidate_scorer`` on the marker's hidden state, and an example's scores are the sums
        over its chunks. There is no ``**kwargs``: Trainer passes ``num_items_in_batch`` to a forward that
        takes them and then treats the model's loss as normalised by it.
        """
        if input_ids.dim() != 3:
            raise ValueError(f"input_ids must be (batch, chunks, length), got shape {tuple(input_ids.shape)}")
        batch, chunks, length = input_ids.shape
        if length > max_tokens(self.config):
            raise ValueError(
                f"chunks of {length} tokens exceed the position table ({max_tokens(self.config)} tokens allowed)"
            )
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
        markers = hidden.gather(1, positions[..., None].expand(-1, -1, hidden.shape[-1]))
        chunk_scores = self.candidate_scorer(self.dropout(markers)).squeeze(-1)  # (n, candidates)
        logits = chunk_scores.new_zeros(batch, chunk_scores.shape[-1]).index_add(0, example_of_chunk, chunk_scores)
        if candidate_mask is not None:
            logits = logits.masked_fill(~candidate_mask.bool(), torch.finfo(logits.dtype).min)

        loss = F.cross_entropy(logits.float(), labels) if labels is not None else None
        return CandidateScoringOutput(loss=loss, logits=logits)


class BertForCandidateScoring(CandidateScoringMixin, BertPreTrainedModel):
    encoder_class = BertModel


class RobertaForCandidateScoring(CandidateScoringMixin, RobertaPreTrainedModel):
    encoder_class = RobertaModel


class XLMRobertaForCandidateScoring(CandidateScoringMixin, XLMRobertaPreTrainedModel):
    encoder_class = XLMRobertaModel


class ElectraForCandidateScoring(CandidateScoringMixin, ElectraPreTrainedModel):
    encoder_class = ElectraModel


class CamembertForCandidateScoring(CandidateScoringMixin, CamembertPreTrainedModel):
    encoder_class = CamembertModel


class LongformerForCandidateScoring(CandidateScoringMixin, LongformerPreTrainedModel):
    encoder_class = LongformerModel


#: config class -> candidate-scoring class (adding an architecture is one class and one entry).
CANDIDATE_SCORING_CLASSES: dict[type[PretrainedConfig], type[PreTrainedModel]] = {
    cls.config_class: cls
    for cls in (
        BertForCandidateScoring,
        RobertaForCandidateScoring,
        XLMRobertaForCandidateScoring,
        ElectraForCandidateScoring,
        CamembertForCandidateScoring,
        LongformerForCandidateScoring,
    )
}


class _CandidateScoringLoader:
    """What ``_EfficientAutoModel`` delegates to (a Transformers auto class elsewhere; Transformers
    has none for this head): the efficient subclass of the config's candidate-scoring class."""

    @staticmethod
    def model_class(config: PretrainedConfig) -> type[PreTrainedModel]:
        if type(config) not in CANDIDATE_SCORING_CLASSES:
            raise ValueError(
                f"no candidate-scoring model for model type {config.model_type!r}; supported: "
                + ", ".join(sorted(c.model_type for c in CANDIDATE_SCORING_CLASSES))
            )
        return efficient_class(CANDIDATE_SCORING_CLASSES[type(config)])

    @classmethod
    def from_pretrained(cls, path: str, *args: Any, config: PretrainedConfig, **kwargs: Any) -> PreTrainedModel:
        return cls.model_class(config).from_pretrained(path, *args, config=config, **kwargs)

    @classmethod
    def from_config(cls, config: PretrainedConfig, **kwargs: Any) -> PreTrainedModel:
        # ``_from_config`` is what Transformers' own ``AutoModel*.from_config`` calls (dtype and
        # attn_implementation handling); there is no public per-class equivalent.
        return cls.model_class(config)._from_config(config, **kwargs)


class AutoModelForCandidateScoring(_EfficientAutoModel):
    """``XxxForCandidateScoring`` for the config's architecture, with ``attn_impl=`` /
    ``attn_config=`` (the rules of ``hea.AutoModel*``)::

        model = AutoModelForCandidateScoring.from_pretrained("outputs/roberta-base-4096-mra2")
        model.save_pretrained("scorer")  # reloads with the same method and scorer
    """

    _auto_class = _CandidateScoringLoader
