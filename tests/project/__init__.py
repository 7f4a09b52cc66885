"""Cross-cutting tests: documents, install, import rules, hermetic suite, reliability, committed results."""
