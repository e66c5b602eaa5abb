"""The sample leaking RAG service, its load generator and the `gpuscope demo` runner."""
