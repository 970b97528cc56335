"""The protocol-neutral core both adapters call: the request steps, and the admin operations
apart."""
