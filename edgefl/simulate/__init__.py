"""`edgefl simulate`: a whole one-shot federation on one machine."""
