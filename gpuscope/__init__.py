"""gpuscope: a terminal console for GPU nodes serving LLM/RAG services.

This module must stay cheap to import: `gpuscope --help` and the headless commands load it.
"""

__version__ = "0.1.0"
