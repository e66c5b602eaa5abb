"""Sessions: recording what the console saw, and reading it back.

    format      the file (SQLite tables, records, keyframes and deltas), shared by writer and reader
    codec       the model's dataclasses as JSON values and back, checked on the way in
    journal     the writer: a session's samples and findings to its file, off the UI thread
    export      a session, or a time range of it, as a snapshot file
    retention   where journals live and which old ones are let go
    findings    what a session found (stacks, allocation sites, diagnoses), and the best of them
    interface   the Session the console works with; the Source a live session samples
    live        the live session: samples teed into the journal where they are taken
    recording   a session file read back, every record checked
    replay      a recording behind the Session interface, with a time cursor
    report      a recording as a Markdown incident report
"""
