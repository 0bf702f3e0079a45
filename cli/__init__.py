"""The `icl-exp` command line: parse, dispatch, print. No science here."""
