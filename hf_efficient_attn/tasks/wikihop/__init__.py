"""WikiHop (QAngaroo) multiple choice: the data offline (``qangaroo``), markers, chunks and the
collator (``data``), the candidate-scoring heads (``heads``) and fine-tuning (``finetune``,
scripts/finetune_wikihop.py)."""
