"""Inputs: parsers of the real formats, and the event-time merge of input files."""
