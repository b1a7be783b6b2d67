"""`lemur-data inspect`: one offline web page for a build (page.py gathers what it shows,
render.py writes the self-contained HTML with page.js and page.css inlined, serve.py
serves it on 127.0.0.1). See docs/inspect.md."""
