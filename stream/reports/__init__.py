"""What is read back from the store: the text report, the HTML page and the evaluation."""
