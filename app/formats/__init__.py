"""How models write: tool-call formats, chat prompt, reasoning, streamed output, grammars."""
