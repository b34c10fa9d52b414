"""fusecli plan per rank: a training step's memory on each rank of a data-parallel layout."""
