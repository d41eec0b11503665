"""Provenance in reverse: which training steps saw a document, a source's documents or a passage (`find`), across
the stages a run grew from (`stages`), and the maximal spans of a text found in the training data (`spans`); the
token files are scanned by one driver (`scan`) where no suffix index answers; one document shown by id, with
its steps (`document`). Which instances of downstream evaluations the training data holds, and the steps that
trained on them (`contamination`, searching many texts in one scan with `text_scan`).
"""

from olmo_data.trace.contamination import MIN_TOKENS as CONTAMINATION_MIN_TOKENS
from olmo_data.trace.contamination import ContaminationReport, EvalInstance, find_contamination, format_contamination
from olmo_data.trace.document import format_document, show_documents
from olmo_data.trace.find import open_run
from olmo_data.trace.spans import MIN_TOKENS, SpansReport, format_spans, marked_text, trace_spans
from olmo_data.trace.stages import ChainTrace, format_chain, trace_chain

__all__ = [
    "CONTAMINATION_MIN_TOKENS",
    "ChainTrace",
    "ContaminationReport",
    "EvalInstance",
    "MIN_TOKENS",
    "SpansReport",
    "find_contamination",
    "format_chain",
    "format_contamination",
    "format_document",
    "format_spans",
    "marked_text",
    "open_run",
    "show_documents",
    "trace_chain",
    "trace_spans",
]
