"""The few helpers every part of the core shares; they import nothing else of gpuscope's but its errors.

    printable   other people's text made safe to show: nothing in it can drive the terminal
    redact      secrets out of command lines, URLs, headers and messages
    markdown    other people's text inside Markdown, unable to break out
    units       how sizes, rates and durations read, everywhere
    atomic      files written at a person's word: regular, private, never half-written
    json_depth  how deep JSON from elsewhere nests, measured before it is parsed
    toml_text   TOML of settings and theme files, parsed in bounded work
    poller      one reader thread per source, coalesced requests, a deadline on every read
"""
