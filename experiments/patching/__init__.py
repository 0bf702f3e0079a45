"""Context -> weight patches: the lemmas once (rank1.py), per-architecture adapters beside them."""
