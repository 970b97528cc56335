"""Scheduling: one scheduler per loaded version (admission, batch formation, execution off the
event loop, the dynamic batcher); sequence/ for the sequence batcher."""
