"""Host adapters: the only code that knows a model library's internals."""
