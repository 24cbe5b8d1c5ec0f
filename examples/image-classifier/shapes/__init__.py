"""The team's own data: coloured shapes on noisy backgrounds, written as an ImageFolder dataset."""
