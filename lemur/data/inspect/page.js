// lemur-data inspect: draws the page from the JSON block `lemur-data` (page.py's data).
// Document text only ever reaches the page through textContent, createTextNode and
// SVG text nodes: never innerHTML, never a link or an attribute a browser would act on,
// so that a document holding markup or a javascript: link stays characters.
"use strict";
(function () {
  const DATA = JSON.parse(document.getElementById("lemur-data").textContent);
  const SAMPLES = DATA.samples || null;
  const SUMMARY = (SAMPLES && SAMPLES.summary) || {};
  const SVGNS = "http://www.w3.org/2000/svg";
  const fmt = new Intl.NumberFormat("en-US");
  const num = (n) => (typeof n === "number" ? fmt.format(n) : String(n == null ? "" : n));
  const pct = (x) => (100 * x).toFixed(1) + "%";

  // An element; `props` sets properties (className, textContent, title, ...) and dataset.
  function el(tag, props, ...children) {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(props || {})) {
      if (k === "data") Object.assign(e.dataset, v);
      else if (k === "on") for (const [ev, f] of Object.entries(v)) e.addEventListener(ev, f);
      else e[k] = v;
    }
    for (const c of children) {
      if (c == null) continue;
      e.appendChild(typeof c === "string" || typeof c === "number" ? document.createTextNode(String(c)) : c);
    }
    return e;
  }
  function svg(tag, attrs) {
    const e = document.createElementNS(SVGNS, tag);
    for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, String(v));
    return e;
  }
  const enc = encodeURIComponent;
  function route() {
    const parts = location.hash.replace(/^#/, "").split("/").map((p) => {
      try { return decodeURIComponent(p); } catch (e) { return p; }
    });
    return { name: parts[0] || "funnel", args: parts.slice(1) };
  }
  function go(...parts) { location.hash = parts.map((p) => enc(String(p))).join("/"); }

  // A sampled document's text: a block of characters, marked when the build cut it.
  function textBlock(text, cut, bytes) {
    const pre = el("pre", { className: "text" + (cut ? " cut" : "") }, String(text == null ? "" : text));
    if (cut && bytes) pre.title = "cut; the whole document is " + num(bytes) + " bytes";
    return pre;
  }
  function meta(pairs) {
    const m = el("div", { className: "meta" });
    for (const [k, v] of pairs) if (v !== undefined && v !== null && v !== "") m.appendChild(el("span", {}, k + ": " + v));
    return m;
  }
  function item(children, open) {
    const d = el("div", { className: "item", tabIndex: 0 }, ...children);
    if (open) {
      d.addEventListener("click", open);
      d.addEventListener("keydown", (e) => { if (e.key === "Enter") open(); });
    }
    return d;
  }
  function note(text) { return el("p", { className: "note" }, text); }
  function table(head, rows, id) {
    const t = el("table", id ? { id } : {});
    t.appendChild(el("thead", {}, el("tr", {}, ...head.map((h) => el("th", {}, h)))));
    const body = el("tbody");
    for (const r of rows) body.appendChild(r instanceof Element ? r : el("tr", {}, ...r.map((c) => el("td", {}, num(c)))));
    t.appendChild(body);
    return t;
  }
  function barRow(label, value, max, cls, onClick, data) {
    const fill = el("div", { className: "fill " + (cls || "") });
    fill.style.width = (max > 0 ? (100 * value) / max : 0) + "%";
    const row = el("div", { className: "barrow", data: data || {} },
      el("span", { className: "label", title: label }, label), el("div", { className: "track" }, fill), el("span", { className: "n" }, num(value)));
    if (onClick) {
      row.classList.add("bar");
      row.tabIndex = 0;
      row.setAttribute("role", "button");
      row.addEventListener("click", onClick);
      row.addEventListener("keydown", (e) => { if (e.key === "Enter") onClick(); });
    }
    return row;
  }
  // A histogram as SVG bars; `cut`, a score where a line is drawn.
  function histogram(edges, counts, cut, width) {
    // Empty bins at either end are left out (length bins run to 16 MiB): the range shown
    // is where documents are, and the cut's bin.
    let a = counts.findIndex((c) => c > 0), b = counts.length - 1 - [...counts].reverse().findIndex((c) => c > 0);
    if (a < 0) { a = 0; b = counts.length - 1; }
    if (cut != null) for (let i = 0; i < counts.length; i++) if (edges[i] <= cut && cut <= edges[i + 1]) { a = Math.min(a, i); b = Math.max(b, i); }
    edges = edges.slice(a, b + 2);
    counts = counts.slice(a, b + 1);
    const w = width || 380, h = 120, pad = 18;
    const s = svg("svg", { class: "hist", width: w, height: h + pad, viewBox: `0 0 ${w} ${h + pad}` });
    const max = Math.max(1, ...counts);
    const bw = w / Math.max(1, counts.length);
    counts.forEach((c, i) => {
      const bh = (h * c) / max;
      const r = svg("rect", { x: i * bw + 0.5, y: h - bh, width: Math.max(1, bw - 1), height: bh });
      if (cut != null && edges[i] >= cut) r.setAttribute("class", "over");
      const t = svg("title");
      t.textContent = `${edges[i]} .. ${edges[i + 1]}: ${num(c)}`;
      r.appendChild(t);
      s.appendChild(r);
    });
    const lo = edges[0], hi = edges[edges.length - 1];
    for (const [x, v, anchor] of [[0, lo, "start"], [w, hi, "end"]]) {
      const t = svg("text", { x, y: h + 13, "text-anchor": anchor });
      t.textContent = typeof v === "number" ? String(+v.toPrecision(4)) : String(v);
      s.appendChild(t);
    }
    if (cut != null && hi > lo) {
      let x = 0; // where the cut falls among the bins (edges may be uneven)
      for (let i = 0; i < counts.length; i++) if (cut >= edges[i]) x = (i + Math.min(1, (cut - edges[i]) / ((edges[i + 1] - edges[i]) || 1))) * bw;
      s.appendChild(svg("line", { class: "cut", x1: x, x2: x, y1: 0, y2: h }));
    }
    return s;
  }

  // ---- sections -------------------------------------------------------------------
  function showFunnel(main) {
    main.appendChild(el("h2", {}, "Funnel: read -> kept by the filters -> left after dedup -> selected by the mix"));
    const rows = DATA.funnel.map((r) => el("tr", { data: { source: r.source } },
      el("td", {}, r.source), el("td", {}, r.domain),
      ...["read", "kept", "deduplicated", "mixed", "available_tokens", "tokens"].map((f) => el("td", { data: { field: f } }, num(r[f])))));
    main.appendChild(table(["source", "domain", "read", "kept", "deduplicated", "mixed (train docs)", "tokens available", "tokens selected"], rows, "funnel"));
    const c = DATA.counts;
    const dropped = Object.values(c.dropped || {}).reduce((a, b) => a + b, 0);
    main.appendChild(note(`all sources: read ${num(c.read)}, dropped ${num(dropped)}, duplicates ${num(c.duplicates)} (exact ${num((c.dedup || {}).exact)}, near ${num((c.dedup || {}).near)}), input errors ${num(c.errors_total)}`));
    const cols = el("div", { className: "cols" });
    for (const r of DATA.funnel) {
      const box = el("div", { className: "funnel" }, el("h3", {}, `${r.source} (${r.domain})`));
      for (const f of ["read", "kept", "deduplicated", "mixed"]) box.appendChild(barRow(f, r[f], Math.max(r.read, r.mixed)));
      cols.appendChild(box);
    }
    main.appendChild(cols);
    main.appendChild(el("h2", {}, "Shards"));
    main.appendChild(table(["split / domain", "shards", "documents", "tokens"],
      Object.entries(DATA.splits).sort().map(([k, v]) => [k, v.shards, v.documents, v.tokens])));
  }

  function dropSamples(source, reason) {
    return ((SAMPLES && SAMPLES.drops) || []).filter((d) => d.source === source && d.reason === reason);
  }
  function showDrops(main, args) {
    const [source, reason] = args;
    main.appendChild(el("h2", {}, "Drops by reason (click a bar for its sampled documents)"));
    const cols = el("div", { className: "cols" });
    let chosen = null; // the selected reason's source: its samples go right below it
    for (const row of DATA.drops.filter((r) => r.source != null)) {
      const entries = Object.entries(row.dropped).sort((a, b) => b[1] - a[1] || (a[0] < b[0] ? -1 : 1));
      const total = entries.reduce((a, [, n]) => a + n, 0);
      const box = el("div", {}, el("h3", {}, `${row.source} (${row.domain}): read ${num(row.read)}, kept ${num(row.kept)}, dropped ${num(total)}`));
      if (!entries.length) box.appendChild(note("nothing dropped"));
      const max = Math.max(1, ...entries.map((e) => e[1]));
      for (const [r, n] of entries) {
        const b = barRow(r, n, max, "", () => go("drops", row.source, r), { source: row.source, reason: r });
        if (row.source === source && r === reason) { b.classList.add("selected"); chosen = box; }
        box.appendChild(b);
      }
      cols.appendChild(box);
    }
    main.appendChild(cols);
    if (source == null) return;
    const list = el("div", { id: "drop-samples" }, el("h2", {}, `Sampled drops: ${source}, ${reason}`));
    const found = dropSamples(source, reason);
    if (!SAMPLES) list.appendChild(note("this build wrote no samples/ folder (inspect: off, or built before it): counts only"));
    const rejected = ((SAMPLES && SAMPLES.rejects) || []).filter((d) => d.source === source && d.reason === reason);
    if (SAMPLES && !found.length && !rejected.length) list.appendChild(note("no sampled document for this reason"));
    for (const [i, d] of [...found, ...rejected].entries()) {
      if (i === found.length) list.appendChild(el("h3", {}, "From the rejects: folder (the first of this reason)"));
      list.appendChild(item([
        el("div", { className: "rule" }, String(d.rule == null ? "" : d.rule)),
        meta([["id", d.id], ["value", d.value], ["op", d.op], ["threshold", d.threshold], ["bytes", d.bytes]]),
        textBlock(d.text, d.cut, d.bytes)]));
    }
    if (chosen) { chosen.after(list); cols.classList.add("dense"); } // the other boxes fill in around it
    else main.appendChild(list);
    (chosen || list).scrollIntoView({ block: "start" }); // the reason's bars, its documents below
  }

  function showMix(main) {
    main.appendChild(el("h2", {}, "Mix: target vs achieved (train tokens)"));
    main.appendChild(table(["domain", "target", "achieved", "tokens"],
      Object.entries(DATA.mix.ratio).map(([d, v]) => el("tr", {}, el("td", {}, d), el("td", {}, pct(v.target)), el("td", {}, pct(v.achieved)), el("td", {}, num(v.tokens)))), "mix-ratio"));
    const cols = el("div", { className: "cols" });
    for (const [d, v] of Object.entries(DATA.mix.ratio)) {
      cols.appendChild(el("div", {}, el("h3", {}, d), barRow("target", +(100 * v.target).toFixed(1), 100, "target"), barRow("achieved", +(100 * v.achieved).toFixed(1), 100, "kept")));
    }
    main.appendChild(cols);
    main.appendChild(el("h2", {}, "Tokens available vs selected per source"));
    const src = Object.entries(DATA.mix.sources);
    const max = Math.max(1, ...src.map(([, s]) => Math.max(s.available_tokens, s.tokens)));
    main.appendChild(table(["source", "domain", "available", "selected", "rate", "documents"],
      src.map(([n, s]) => el("tr", { data: { source: n } }, el("td", {}, n), el("td", {}, s.domain), el("td", {}, num(s.available_tokens)), el("td", {}, num(s.tokens)), el("td", {}, (+s.rate).toFixed(4)), el("td", {}, num(s.documents)))), "mix-sources"));
    const bars = el("div", { className: "cols" });
    for (const [n, s] of src) bars.appendChild(el("div", {}, el("h3", {}, n), barRow("available", s.available_tokens, max, "target"), barRow("selected", s.tokens, max, "kept")));
    main.appendChild(bars);
    const langs = [];
    for (const [d, per] of Object.entries(DATA.languages || {})) for (const [l, u] of Object.entries(per)) langs.push([`${d} / ${l}`, u.available, u.budget, u.tokens, (+u.rate).toFixed(4)]);
    if (langs.length) {
      main.appendChild(el("h2", {}, "Mix by language"));
      main.appendChild(table(["domain / language", "available", "target", "achieved", "rate"], langs));
    }
  }

  function showHistograms(main) {
    const hist = SUMMARY.histograms || {};
    const drawAll = (title, about, per) => {
      main.appendChild(el("h2", {}, title));
      main.appendChild(note(about));
      const cols = el("div", { className: "cols" });
      for (const [d, h] of Object.entries(per)) cols.appendChild(el("div", {}, el("h3", {}, d), histogram(h.edges, h.counts, null)));
      main.appendChild(cols);
    };
    if (hist.length && !Array.isArray(hist.length)) drawAll("Document length per domain", "UTF-8 bytes per document, every document the filters kept (samples summary.json); bins of powers of two", hist.length);
    drawAll("Tokens per document in the shards", "per split/domain, BOS/EOS included, from the shard indexes; log-spaced bins", DATA.length_histograms || {});
    main.appendChild(el("h2", {}, "Languages per domain"));
    let langs = hist.language;
    if (!langs) { // the train split's documents by language (stats.json's groups)
      langs = {};
      for (const g of DATA.groups || []) if (g.split === "train") {
        const per = (langs[g.domain] = langs[g.domain] || {});
        per[g.language] = (per[g.language] || 0) + g.documents;
      }
    }
    const lc = el("div", { className: "cols" });
    for (const [d, per] of Object.entries(langs)) {
      const entries = Object.entries(per).sort((a, b) => b[1] - a[1]);
      const max = Math.max(1, ...entries.map((e) => e[1]));
      const box = el("div", {}, el("h3", {}, d));
      for (const [l, n] of entries.slice(0, 30)) box.appendChild(barRow(l, n, max, "kept"));
      lc.appendChild(box);
    }
    main.appendChild(lc);
  }

  function showClassifiers(main) {
    const hist = (SUMMARY.histograms || {}).classifier || {};
    const border = SUMMARY.classifier_borderline || {};
    const names = new Set([...Object.keys(DATA.classifiers || {}), ...Object.keys(hist)]);
    main.appendChild(el("h2", {}, "Quality classifiers"));
    if (!names.size) main.appendChild(note("this build ran no quality classifier"));
    for (const name of names) {
      const facts = (DATA.classifiers || {})[name] || {};
      main.appendChild(el("h3", {}, name));
      if (facts.label) main.appendChild(note(`label ${facts.label}; kept ${num(facts.kept)}, dropped ${num(facts.dropped)}, scored ${num(facts.scored)}` +
        (facts.min_score != null ? `; min_score ${facts.min_score}` : "") + (facts.keep_top != null ? `; keep_top ${facts.keep_top}` : "")));
      const h = hist[name];
      if (h) main.appendChild(histogram(h.edges, h.counts, h.cut, 560));
      if (h && h.cut == null && h.cuts && Object.keys(h.cuts).length) // keep_top: a cut per source
        main.appendChild(note("cut per source: " + Object.entries(h.cuts).map(([s, c]) => `${s} ${(+c).toFixed(4)}`).join(", ")));
      const docs = border[name] || [];
      const ex = facts.examples || {};
      if (docs.length) main.appendChild(el("h3", {}, "documents around the cut"));
      for (const d of docs) main.appendChild(item([meta([["score", d.score], ["id", d.id]]), textBlock(d.text)]));
      for (const [kind, list] of Object.entries(ex)) for (const d of list) main.appendChild(item([meta([["example", kind], ["score", d.score], ["id", d.id]]), textBlock(d.text)]));
    }
  }

  // Word-level differences of two texts: for each side, [word, changed] pairs.
  function wordDiff(a, b) {
    const A = a.split(/(\s+)/).slice(0, 1500), B = b.split(/(\s+)/).slice(0, 1500);
    const n = A.length, m = B.length, L = new Uint16Array((n + 1) * (m + 1));
    for (let i = n - 1; i >= 0; i--) for (let j = m - 1; j >= 0; j--)
      L[i * (m + 1) + j] = A[i] === B[j] ? L[(i + 1) * (m + 1) + j + 1] + 1 : Math.max(L[(i + 1) * (m + 1) + j], L[i * (m + 1) + j + 1]);
    const left = [], right = [];
    let i = 0, j = 0;
    while (i < n && j < m) {
      if (A[i] === B[j]) { left.push([A[i++], false]); right.push([B[j++], false]); }
      else if (L[(i + 1) * (m + 1) + j] >= L[i * (m + 1) + j + 1]) left.push([A[i++], true]);
      else right.push([B[j++], true]);
    }
    while (i < n) left.push([A[i++], true]);
    while (j < m) right.push([B[j++], true]);
    return [left, right];
  }
  function diffBlock(words, cls, rest) {
    const pre = el("pre", { className: "text" });
    for (const [w, changed] of words) pre.appendChild(changed ? el("span", { className: cls }, w) : document.createTextNode(w));
    if (rest) pre.appendChild(document.createTextNode(rest));
    return pre;
  }
  function showDedup(main, args) {
    const clusters = (SAMPLES && SAMPLES.near_duplicates) || [];
    const exact = (SAMPLES && SAMPLES.exact_duplicates) || [];
    const d = DATA.counts.dedup || {};
    main.appendChild(el("h2", {}, `Near-duplicate clusters (${num(d.near)} near and ${num(d.exact)} exact duplicates removed)`));
    if (!SAMPLES) main.appendChild(note("this build wrote no samples/ folder: counts only"));
    const [ci, ri] = [args[0] == null ? -1 : +args[0], +(args[1] || 0)];
    clusters.forEach((c, i) => {
      const it = item([meta([["cluster", c.cluster], ["source", c.source], ["size", c.size], ["removed shown", (c.removed || []).length]]),
        el("div", { className: "note" }, "kept: " + String((c.kept || {}).id))], () => go("dedup", i, 0));
      if (i === ci) it.classList.add("selected");
      main.appendChild(it);
      if (i !== ci) return;
      const kept = c.kept || {}, removed = (c.removed || [])[ri] || {};
      const nav = el("div", { className: "controls" });
      (c.removed || []).forEach((r, j) => nav.appendChild(el("button", { type: "button", on: { click: (e) => { e.stopPropagation(); go("dedup", i, j); } } }, `removed ${j + 1}: jaccard ${r.jaccard}`)));
      const [l, r] = wordDiff(String(kept.text || ""), String(removed.text || ""));
      const pane = el("div", { className: "side", id: "dedup-side" },
        el("div", {}, meta([["kept", kept.id]]), diffBlock(l, "del")),
        el("div", {}, meta([["removed", removed.id], ["jaccard", removed.jaccard]]), diffBlock(r, "ins")));
      main.appendChild(nav);
      main.appendChild(pane);
    });
    main.appendChild(el("h2", {}, "Exact duplicates"));
    if (!exact.length) main.appendChild(note("no sample"));
    for (const e of exact) main.appendChild(item([meta([["source", e.source], ["copies", e.copies], ["kept", (e.kept || {}).id]]), textBlock((e.kept || {}).text, (e.kept || {}).cut)]));
  }

  function showOther(main) {
    const pii = (SAMPLES && SAMPLES.pii) || [];
    const counts = SUMMARY.pii_counts || DATA.counts.pii || {};
    main.appendChild(el("h2", {}, "PII redacted (counts by kind; samples show the redacted text only)"));
    main.appendChild(table(["kind", "redactions"], Object.entries(counts).map(([k, n]) => [k, n])));
    for (const p of pii) main.appendChild(item([meta([["source", p.source], ["id", p.id], ["kinds", Object.entries(p.kinds || {}).map(([k, n]) => `${k} ${n}`).join(", ")]]), textBlock(p.text, p.cut)]));
    main.appendChild(el("h2", {}, "Decontamination hits"));
    const hits = (SAMPLES && SAMPLES.decontamination) || [];
    const dc = DATA.counts.decontaminated || {};
    main.appendChild(note("documents dropped per benchmark: " + (Object.entries(dc).map(([k, n]) => `${k} ${num(n)}`).join(", ") || "none")));
    for (const h of hits) main.appendChild(item([meta([["source", h.source], ["id", h.id], ["benchmark", h.benchmark], ["task", h.task_id]]),
      el("div", { className: "rule" }, "n-gram: " + String(h.ngram == null ? "" : h.ngram)), textBlock(h.excerpt)]));
  }

  function showKept(main) {
    const kept = (SAMPLES && SAMPLES.kept) || [];
    main.appendChild(el("h2", {}, "Kept documents (per source and language; FIM and repository documents)"));
    if (!SAMPLES) main.appendChild(note("this build wrote no samples/ folder"));
    let group = null;
    for (const k of kept) {
      const g = `${k.kind}: ${k.source} (${k.domain}) / ${k.language}`;
      if (g !== group) main.appendChild(el("h3", {}, (group = g)));
      main.appendChild(item([meta([["id", k.id], ["bytes", k.bytes]]), textBlock(k.text, k.cut, k.bytes)]));
    }
  }

  // ---- shard browser --------------------------------------------------------------
  const B = DATA.browser;
  const SECTION_OF = { prefix: "fim-prefix", suffix: "fim-suffix", middle: "fim-middle" };
  function renderDoc(doc) {
    const box = el("div", { id: "doc-text" });
    let section = null; // the FIM part the tokens belong to: the last marker's
    const plainSeps = new Set(doc.file_seps || []); // `<file_sep>` spelled in text
    doc.ids.forEach((id, i) => {
      if (plainSeps.has(i)) box.appendChild(el("span", { className: "filesep" }));
      const role = B.roles[String(id)];
      const control = B.control[String(id)] ?? (B.added || {})[String(id)];
      let span;
      if (role || control != null) {
        span = el("span", { className: "tok ctl" + (role ? " marker" : ""), title: `id ${id}` + (role ? ` (${role})` : "") });
        span.dataset.label = role ? "<" + role + ">" : control;
        if (role in SECTION_OF) section = SECTION_OF[role];
        if (role === "file_sep") box.appendChild(el("span", { className: "filesep" }));
      } else {
        span = el("span", { className: "tok", title: `id ${id}` }, doc.pieces[i]);
        if (section) span.classList.add(section);
      }
      if (doc.mask && doc.mask[i] === "1") span.classList.add("loss");
      box.appendChild(span);
    });
    return box;
  }
  function showShards(main, args) {
    main.appendChild(el("h2", {}, "Shard browser"));
    if (!B.shards.length) { main.appendChild(note("no shard")); return; }
    let si = Math.min(B.shards.length - 1, Math.max(0, +(args[0] || 0)));
    const shard = B.shards[si];
    let di = Math.min(shard.docs.length - 1, Math.max(0, +(args[1] || 0)));
    const splits = [...new Set(B.shards.map((s) => s.split))];
    const splitSel = el("select", { id: "split", on: { change: () => go("shards", B.shards.findIndex((s) => s.split === splitSel.value), 0) } },
      ...splits.map((s) => el("option", { value: s, selected: s === shard.split }, `${s} (${num(B.shards_per_split[s])} shards)`)));
    const shardSel = el("select", { id: "shard", on: { change: () => go("shards", shardSel.value, 0) } });
    B.shards.forEach((s, i) => { if (s.split === shard.split) shardSel.appendChild(el("option", { value: String(i), selected: i === si }, `${s.file} (${s.domain}, ${num(s.documents)} docs)`)); });
    const docSel = el("select", { id: "doc", on: { change: () => go("shards", si, docSel.value) } },
      ...shard.docs.map((d, i) => el("option", { value: String(i), selected: i === di }, `document ${num(d.index)} (${num(d.length)} tokens)`)));
    const bounds = el("input", { type: "checkbox", id: "toggle-boundaries", checked: document.body.classList.contains("bounds"),
      on: { change: () => document.body.classList.toggle("bounds", bounds.checked) } });
    main.appendChild(el("div", { className: "controls" }, el("label", {}, "split ", splitSel), el("label", {}, "shard ", shardSel), el("label", {}, "document ", docSel),
      el("label", {}, bounds, " token boundaries (t)")));
    const n = B.shards_per_split[shard.split];
    main.appendChild(note(`${num(shard.docs.length)} of ${num(shard.documents)} documents of this shard embedded (the first, then a seeded sample), at most ${num(B.limits.max_tokens)} tokens each` +
      (n > B.shards.filter((s) => s.split === shard.split).length ? `; ${num(n)} shards in this split, the first shown` : "")));
    main.appendChild(el("div", { className: "legend" }, el("span", { className: "ctl" }, "control / special"), el("span", { className: "fim-prefix" }, "FIM prefix"),
      el("span", { className: "fim-middle" }, "FIM middle"), el("span", { className: "fim-suffix" }, "FIM suffix"), el("span", { className: "loss" }, "loss taken (chat)")));
    const doc = shard.docs[di];
    main.appendChild(meta([["document", doc.index], ["offset", doc.offset], ["tokens", doc.length], ["cut", doc.cut ? `first ${doc.ids.length} tokens shown` : ""]]));
    main.appendChild(renderDoc(doc));
  }

  // ---- search ---------------------------------------------------------------------
  function* sampleTexts() {
    if (!SAMPLES) return;
    for (const d of SAMPLES.drops || []) yield ["drop", `${d.source} / ${d.reason}`, d.id, d.text, () => go("drops", d.source, d.reason)];
    for (const d of SAMPLES.rejects || []) yield ["rejected", `${d.source} / ${d.reason}`, d.id, d.text, () => go("drops", d.source, d.reason)];
    for (const k of SAMPLES.kept || []) yield ["kept", `${k.source} / ${k.language}`, k.id, k.text, () => go("kept")];
    for (const [i, c] of (SAMPLES.near_duplicates || []).entries()) {
      yield ["near duplicate", c.source, (c.kept || {}).id, (c.kept || {}).text, () => go("dedup", i, 0)];
      for (const [j, r] of (c.removed || []).entries()) yield ["near duplicate (removed)", c.source, r.id, r.text, () => go("dedup", i, j)];
    }
    for (const e of SAMPLES.exact_duplicates || []) yield ["exact duplicate", e.source, (e.kept || {}).id, (e.kept || {}).text, () => go("dedup")];
    for (const p of SAMPLES.pii || []) yield ["pii", p.source, p.id, p.text, () => go("other")];
    for (const h of SAMPLES.decontamination || []) yield ["decontamination", `${h.source} / ${h.benchmark}`, h.id, h.excerpt, () => go("other")];
  }
  function showSearch(main, args) {
    const q = args.join("/");
    main.appendChild(el("h2", {}, `Search the samples: "${q}"`));
    if (!q) { main.appendChild(note("type in the search box (/)")); return; }
    const needle = q.toLowerCase();
    let n = 0;
    const list = el("div", { id: "search-results" });
    for (const [kind, where, id, text, open] of sampleTexts()) {
      const t = String(text == null ? "" : text), at = t.toLowerCase().indexOf(needle);
      const idHit = String(id).toLowerCase().includes(needle);
      if (at < 0 && !idHit) continue;
      if (++n > 200) break;
      const a = Math.max(0, at - 80), snippet = el("pre", { className: "text" });
      if (at >= 0) snippet.append(t.slice(a, at), el("mark", { className: "hit" }, t.slice(at, at + q.length)), t.slice(at + q.length, at + q.length + 160));
      list.appendChild(item([meta([["kind", kind], ["where", where], ["id", id]]), snippet], open));
    }
    main.appendChild(note(n > 200 ? "more than 200 matches: the first 200" : n ? `${n} matches` : "no match"));
    main.appendChild(list);
  }

  // ---- frame, routes and keys -----------------------------------------------------
  const SECTIONS = [
    ["funnel", "Funnel", showFunnel], ["drops", "Drops", showDrops], ["mix", "Mix", showMix],
    ["histograms", "Histograms", showHistograms], ["classifiers", "Classifiers", showClassifiers],
    ["dedup", "Duplicates", showDedup], ["other", "PII & decontamination", showOther],
    ["kept", "Kept", showKept], ["shards", "Shards", showShards], ["search", "Search", showSearch],
  ];
  const main = el("main", { id: "main" });
  const search = el("input", { id: "search", type: "search", placeholder: "search samples  ( / )", autocomplete: "off" });
  const nav = el("nav", {}, ...SECTIONS.map(([id, title], i) => el("a", { href: "#" + id, id: "nav-" + id, title: `${title} (${i < 9 ? i + 1 : 0})` }, title)));
  const b = DATA.build;
  document.body.append(el("header", {}, el("h1", {}, "lemur-data inspect: " + DATA.name),
    el("span", { className: "facts" }, `${b.dtype}, seq_len ${num(b.seq_len)}, vocab ${num(b.vocab_size)}; ${b.framing}${b.chat ? "; chat (loss masks)" : ""}${SAMPLES ? "" : "; no samples/"}`),
    nav, search), main,
    el("p", { className: "keys" }, "keys: ", el("kbd", {}, "/"), " search, ", el("kbd", {}, "j"), "/", el("kbd", {}, "k"), " next/previous, ", el("kbd", {}, "Enter"), " open, ", el("kbd", {}, "t"), " token boundaries, ", el("kbd", {}, "1"), "-", el("kbd", {}, "9"), " sections"));
  function draw() {
    const r = route();
    const s = SECTIONS.find((x) => x[0] === r.name) || SECTIONS[0];
    main.replaceChildren();
    window.scrollTo(0, 0); // a new view starts at its top (a sampled list scrolls itself)
    for (const a of nav.children) a.classList.toggle("active", a.id === "nav-" + s[0]);
    if (document.activeElement !== search) search.value = s[0] === "search" ? r.args.join("/") : "";
    s[2](main, r.args);
  }
  search.addEventListener("input", () => { history.replaceState(null, "", "#search/" + enc(search.value)); draw(); });
  window.addEventListener("hashchange", draw);
  function step(delta) {
    const r = route();
    if (r.name === "shards") {
      const si = +(r.args[0] || 0), docs = B.shards[si] ? B.shards[si].docs.length : 0;
      if (docs) go("shards", si, Math.min(docs - 1, Math.max(0, +(r.args[1] || 0) + delta)));
      return;
    }
    const items = [...main.querySelectorAll(".item, .bar")];
    if (!items.length) return;
    const at = items.indexOf(document.activeElement);
    const next = items[Math.min(items.length - 1, Math.max(0, at < 0 ? 0 : at + delta))];
    next.focus();
    next.scrollIntoView({ block: "nearest" });
  }
  document.addEventListener("keydown", (e) => {
    const typing = e.target instanceof HTMLInputElement && e.target.type !== "checkbox" || e.target instanceof HTMLSelectElement;
    if (e.key === "Escape" && typing) { e.target.blur(); return; }
    if (typing || e.ctrlKey || e.metaKey || e.altKey) return;
    if (e.key === "/") { e.preventDefault(); search.focus(); search.select(); }
    else if (e.key === "j" || e.key === "ArrowDown") { e.preventDefault(); step(1); }
    else if (e.key === "k" || e.key === "ArrowUp") { e.preventDefault(); step(-1); }
    else if (e.key === "t") { document.body.classList.toggle("bounds"); const c = document.getElementById("toggle-boundaries"); if (c) c.checked = document.body.classList.contains("bounds"); }
    else if (/^[1-9]$/.test(e.key) && SECTIONS[+e.key - 1]) go(SECTIONS[+e.key - 1][0]);
  });
  draw();
})();
