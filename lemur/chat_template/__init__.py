"""A tokenizer.json model's own chat template: rendered and encoded as transformers does."""

from lemur.chat_template.spans import (
    CONTROL_TEXT,
    TEMPLATE_CONTENT,
    TEMPLATE_ERROR,
    TemplateDrop,
)
from lemur.chat_template.template import ChatTemplate, TemplateChat, template_source

__all__ = [
    "CONTROL_TEXT",
    "TEMPLATE_CONTENT",
    "TEMPLATE_ERROR",
    "ChatTemplate",
    "TemplateChat",
    "TemplateDrop",
    "template_source",
]
