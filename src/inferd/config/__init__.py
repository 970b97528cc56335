"""Model configuration: `config.pbtxt` read and checked field by field, the field table, parameters
(no lifecycle)."""
