"""Pure decisions: host patterns, address classification and the gate's verdicts, each with its reason."""
