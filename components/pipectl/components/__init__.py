"""Step code: what each pipeline step runs inside its container."""
