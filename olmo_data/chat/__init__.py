"""Chat conversations into token ids and label masks for supervised fine-tuning (`olmo-data prepare-tulu`).

`prepare` runs it (`prepare_chat`, its options, summary and manifest); `rows` reads and checks the Tulu-format
input rows; `templates` turns a conversation into ids and a label mask (the olmo and tulu templates), and
`hf_template` does it with a tokenizer's own chat template rendered by transformers (the one module that imports
it, lazily); `packing` places examples into instances and names the files of the destination
(`read_doc_boundaries` reads them back).
"""

from olmo_data.chat.hf_template import ChatTemplate, TemplateEncoder, resolve_template
from olmo_data.chat.packing import (
    BOUNDARIES,
    DOC_METADATA,
    EXAMPLES,
    INPUT_IDS,
    LABEL_MASK,
    OUTPUT_FILES,
    InstanceWriter,
    read_doc_boundaries,
)
from olmo_data.chat.prepare import (
    CHUNK_CONVERSATIONS,
    DEFAULT_PACK_WINDOW,
    DROP_NO_ASSISTANT,
    DROP_TRUNCATED,
    FORMAT,
    ChatOptions,
    ChatSummary,
    prepare_chat,
)
from olmo_data.chat.rows import BAD_ROW_HINT, ROLES, Conversation, RowChunk, is_hub_dataset, parse_rows
from olmo_data.chat.templates import TEMPLATES, Segment, encode_conversations, render

__all__ = [
    "BAD_ROW_HINT",
    "BOUNDARIES",
    "CHUNK_CONVERSATIONS",
    "DEFAULT_PACK_WINDOW",
    "DOC_METADATA",
    "DROP_NO_ASSISTANT",
    "DROP_TRUNCATED",
    "EXAMPLES",
    "FORMAT",
    "INPUT_IDS",
    "LABEL_MASK",
    "OUTPUT_FILES",
    "ROLES",
    "TEMPLATES",
    "ChatOptions",
    "ChatTemplate",
    "ChatSummary",
    "Conversation",
    "InstanceWriter",
    "RowChunk",
    "Segment",
    "TemplateEncoder",
    "encode_conversations",
    "is_hub_dataset",
    "parse_rows",
    "prepare_chat",
    "read_doc_boundaries",
    "render",
    "resolve_template",
]
