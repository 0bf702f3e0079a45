"""Figure pieces shared by several experiments."""
