"""A lemur shard folder written in other trainers' formats (`lemur-data export`).

formats: what every format is given (one shard as a `ShardPart`, the corpus as an
`ExportInfo`) and must do (`Exporter`), and the registry of format names. One module per
format holds that format's bytes, both ways where lemur-train reads it too.
"""
