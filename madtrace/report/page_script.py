# SPDX-License-Identifier: GPL-2.0-or-later
"""The script of the HTML page (report/html.py), inline in the page: no
external resource.  A Python string so that it ships with the package like
any module (the wheel carries no data files).

What it does, on the markup html.py writes:

* every ``div.tbl`` (``html.table``): clicking a header (or Enter on it)
  sorts the rows on that column, numbers numerically and text by code point
  ignoring case, on each cell's ``data-v`` when it has one, else its text;
  numbers the largest first, text from A; clicking again reverses.  The
  filter box hides the rows whose text does not contain what is typed.
  Rows past the table's ``data-limit`` stay hidden until "show all"; the
  sort and the filter work over every row.  ``tr.gap`` rows (lines left
  out of an annotated source) show only in the natural order, unfiltered.
* every ``div.hm`` (``html.heatmap_section``): draws the page heat map on a
  canvas from the JSON in its ``script.hm-data`` (regions, their non-zero
  cells), only the part in view, so a map of any size scrolls smoothly:
  zoom with the buttons, Ctrl+wheel or the +/- keys; hovering names the
  region, the page(s) and the counts.  A region without any access (grey
  when untraced) takes one line; runs of three rows or more of untouched
  pages fold into one line (a checkbox unfolds them).
"""

SCRIPT = r"""
(function () {
  "use strict";
  function each(list, f) { Array.prototype.forEach.call(list, f); }

  // ------------------------------------------------------------------ tables
  function rowText(r) {
    if (r._t === undefined) r._t = r.textContent.toLowerCase();
    return r._t;
  }
  function key(r, col, num) {
    var gap = r.classList.contains("gap");
    if (gap && col !== 0) return null;
    var td = r.cells[gap ? 0 : col];
    if (!td) return null;
    var v = td.hasAttribute("data-v") ? td.getAttribute("data-v") : td.textContent;
    if (num) {
      var x = parseFloat(v);
      return isNaN(x) ? null : x;
    }
    return v.toLowerCase();
  }
  function sortTable(s, col) {
    var num = s.heads[col].getAttribute("data-type") === "num";
    var dir = s.col === col ? -s.dir : (num ? -1 : 1);
    s.col = col;
    s.dir = dir;
    var keyed = s.rows.map(function (r) { return {r: r, k: key(r, col, num)}; });
    keyed.sort(function (a, b) {
      if (a.k === null || b.k === null) {
        if (a.k === b.k) return a.r._i - b.r._i;
        return a.k === null ? 1 : -1;            // empty cells last, either way
      }
      var c = a.k < b.k ? -1 : (a.k > b.k ? 1 : 0);
      return c !== 0 ? c * dir : a.r._i - b.r._i;
    });
    s.order = keyed.map(function (x) { return x.r; });
    var frag = document.createDocumentFragment();
    s.order.forEach(function (r) { frag.appendChild(r); });
    s.body.appendChild(frag);
    each(s.heads, function (th, i) {
      if (i === col) th.setAttribute("aria-sort", dir > 0 ? "ascending" : "descending");
      else th.removeAttribute("aria-sort");
    });
  }
  function refresh(s) {
    var natural = s.col === -1 || (s.col === 0 && s.dir === 1);
    var q = s.query, shown = 0, match = 0;
    s.order.forEach(function (r) {
      var gap = r.classList.contains("gap");
      var ok = gap ? (natural && !q) : (!q || rowText(r).indexOf(q) >= 0);
      if (ok && !gap) match++;
      var visible = ok && (s.all || !s.limit || shown < s.limit);
      if (visible && !gap) shown++;
      r.hidden = !visible;
    });
    if (s.count) {
      s.count.textContent = q ? (match + " of " + s.rows.length + " rows match")
                              : (s.rows.length + " rows");
    }
    if (s.button) {
      s.button.hidden = !s.limit || match <= s.limit;
      s.button.textContent = s.all ? ("show the first " + s.limit)
                                   : ("show all " + match + " rows");
    }
    s.box.setAttribute("data-shown", String(shown));
  }
  function setupTable(box) {
    var t = box.querySelector("table");
    if (!t || !t.tHead || !t.tBodies.length) return;
    var body = t.tBodies[0];
    var rows = Array.prototype.slice.call(body.rows);
    rows.forEach(function (r, i) { r._i = i; });
    var s = {box: box, body: body, rows: rows, order: rows.slice(), col: -1, dir: 0, query: "",
             all: false, limit: parseInt(box.getAttribute("data-limit") || "0", 10) || 0,
             heads: t.tHead.rows[0].cells, count: box.querySelector(".count"),
             button: box.querySelector("button.all")};
    each(s.heads, function (th, col) {
      th.tabIndex = 0;
      th.title = "sort by " + th.textContent;
      function go() { sortTable(s, col); refresh(s); }
      th.addEventListener("click", go);
      th.addEventListener("keydown", function (e) {
        if (e.key === "Enter" || e.key === " ") { e.preventDefault(); go(); }
      });
    });
    var input = box.querySelector("input.filter");
    if (input) {
      input.addEventListener("input", function () {
        s.query = input.value.trim().toLowerCase();
        refresh(s);
      });
    }
    if (s.button) s.button.addEventListener("click", function () { s.all = !s.all; refresh(s); });
    refresh(s);
  }

  // ---------------------------------------------------------------- heat map
  var PALETTE = [[255, 255, 204], [255, 237, 160], [254, 217, 118], [254, 178, 76],
                 [253, 141, 60], [252, 78, 42], [227, 26, 28], [189, 0, 38], [128, 0, 38]];
  var SIZES = [2, 3, 4, 6, 8, 10, 12, 16, 20, 24, 32, 48, 64];   // px per cell
  var LABEL_W = 300, LINE = 18, FOLD = 14, PAD = 4, GREY = "#b8b8b8", UNTOUCHED = "#e6f0ff";
  var FONT = "12px system-ui, sans-serif";

  function ylorrd(t) {
    t = Math.max(0, Math.min(1, t)) * (PALETTE.length - 1);
    var i = Math.min(Math.floor(t), PALETTE.length - 2), f = t - i, a = PALETTE[i], b = PALETTE[i + 1];
    return "rgb(" + Math.round(a[0] + (b[0] - a[0]) * f) + "," + Math.round(a[1] + (b[1] - a[1]) * f) +
           "," + Math.round(a[2] + (b[2] - a[2]) * f) + ")";
  }
  function colour(v, max) {
    var level = max <= 1 ? 1 : Math.log(v) / Math.log(max);
    return ylorrd(0.25 + 0.75 * Math.min(level, 1));
  }
  function fmt(n) { return Number(n).toLocaleString("en-US"); }
  function hex(big) { return "0x" + big.toString(16); }

  function cellsOf(r) {                    // values per cell, and where each one's counts are
    if (!r._v) {
      r._v = new Float64Array(r.cells);
      r._at = new Int32Array(r.cells);
      r.data.forEach(function (c, i) { r._v[c[0]] = c[1] + c[2] + c[3]; r._at[c[0]] = i + 1; });
    }
    return r._v;
  }
  function rowsWithData(r, columns) {
    var rows = Math.max(1, Math.ceil(r.cells / columns)), has = new Uint8Array(rows);
    r.data.forEach(function (c) { has[Math.floor(c[0] / columns)] = 1; });
    return has;
  }
  function layout(m) {
    var items = [], at = {}, y = 0, cs = m.cell, cols = m.d.columns;
    m.d.regions.forEach(function (r, ri) {
      if (!r.traced || !r.data.length) {         // one line: untraced, or never accessed
        items.push({t: "u", r: r, ri: ri, y: y, h: LINE});
        at[ri + ":h"] = items[items.length - 1];
        y += LINE + PAD;
        return;
      }
      items.push({t: "h", r: r, ri: ri, y: y, h: LINE});
      at[ri + ":h"] = items[items.length - 1];
      y += LINE;
      var rows = Math.max(1, Math.ceil(r.cells / cols)), has = rowsWithData(r, cols);
      for (var i = 0; i < rows;) {
        if (m.fold && !has[i]) {
          var j = i;
          while (j < rows && !has[j]) j++;
          if (j - i >= 3) {
            items.push({t: "g", r: r, ri: ri, from: i, to: j, y: y, h: FOLD});
            for (var k = i; k < j; k++) at[ri + ":" + k] = items[items.length - 1];
            y += FOLD;
            i = j;
            continue;
          }
        }
        items.push({t: "c", r: r, ri: ri, row: i, y: y, h: cs});
        at[ri + ":" + i] = items[items.length - 1];
        y += cs;
        i++;
      }
      y += PAD;
    });
    m.items = items;
    m.at = at;
    m.height = y;
    m.width = LABEL_W + cols * cs + 8;
    m.space.style.width = m.width + "px";
    m.space.style.height = m.height + "px";
    m.view.style.height = Math.max(80, Math.min(m.height + 2, Math.round(window.innerHeight * 0.7))) + "px";
    m.zoomText.textContent = cs + " px per cell";
  }
  function find(items, y) {                // the last item starting at or above y
    var lo = 0, hi = items.length - 1, best = -1;
    while (lo <= hi) {
      var mid = (lo + hi) >> 1;
      if (items[mid].y <= y) { best = mid; lo = mid + 1; } else hi = mid - 1;
    }
    return best;
  }
  function fit(ctx, text, width) {          // text shortened with an ellipsis to fit width px
    if (ctx.measureText(text).width <= width) return text;
    var lo = 0, hi = text.length;
    while (lo < hi) {
      var mid = (lo + hi + 1) >> 1;
      if (ctx.measureText(text.slice(0, mid) + "\u2026").width <= width) lo = mid; else hi = mid - 1;
    }
    return text.slice(0, lo) + "\u2026";
  }
  function pagesText(r) {
    return fmt(r.pages) + (r.pages === 1 ? " page" : " pages") +
           (r.cell_pages > 1 ? ", " + r.cell_pages + " per cell" : "");
  }
  function detail(r) {
    if (!r.traced) return r.start + "  " + pagesText(r) + ", not traced";
    if (!r.data.length) return r.start + "  " + pagesText(r) + ", not accessed";
    return r.start + "  " + pagesText(r) + "  L " + fmt(r.loads) + "  S " + fmt(r.stores) +
           (r.block_events ? "  B " + fmt(r.block_events) : "") + "  " + fmt(r.touched_pages) + " touched";
  }
  function rowAddress(m, r, row) {
    if (r._first === undefined) r._first = BigInt(r.first_page);
    return hex(r._first + BigInt(row * m.d.columns * r.cell_pages * m.d.page_size));
  }
  function draw(m) {
    m.pending = false;
    var view = m.view, w = view.clientWidth, h = view.clientHeight, dpr = window.devicePixelRatio || 1;
    var canvas = m.canvas;
    if (canvas.width !== Math.round(w * dpr) || canvas.height !== Math.round(h * dpr)) {
      canvas.width = Math.round(w * dpr);
      canvas.height = Math.round(h * dpr);
      canvas.style.width = w + "px";
      canvas.style.height = h + "px";
    }
    var top = view.scrollTop, left = view.scrollLeft;
    canvas.style.left = left + "px";
    canvas.style.top = top + "px";
    var ctx = canvas.getContext("2d"), cs = m.cell, cols = m.d.columns, max = m.d.max_cell;
    var gx = LABEL_W - left, gap = cs >= 6 ? 1 : 0;
    ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
    ctx.fillStyle = "#fff";
    ctx.fillRect(0, 0, w, h);
    ctx.font = FONT;
    ctx.textBaseline = "middle";
    var first = Math.max(0, find(m.items, top)), last = first;
    // the grid, right of the label column
    ctx.save();
    ctx.beginPath();
    ctx.rect(LABEL_W, 0, Math.max(0, w - LABEL_W), h);
    ctx.clip();
    for (var i = first; i < m.items.length && m.items[i].y < top + h; i++) {
      var it = m.items[i], r = it.r, y = it.y - top;
      last = i;
      if (it.t === "c") {
        var v = cellsOf(r), k0 = it.row * cols, k1 = Math.min(k0 + cols, r.cells);
        for (var k = k0; k < k1; k++) {
          ctx.fillStyle = v[k] > 0 ? colour(v[k], max) : UNTOUCHED;
          ctx.fillRect(gx + (k - k0) * cs, y, cs - gap, cs - gap);
        }
      } else if (it.t === "g") {
        ctx.fillStyle = UNTOUCHED;
        ctx.fillRect(gx, y + 2, cols * cs - gap, it.h - 4);
        ctx.fillStyle = "#667";
        var n = it.to - it.from, pages = Math.min(r.pages - it.from * cols * r.cell_pages,
                                                  n * cols * r.cell_pages);
        ctx.fillText("\u22ef " + fmt(n) + " rows of untouched pages (" + fmt(pages) + " pages)",
                     Math.max(gx, LABEL_W) + 4, y + it.h / 2);
      } else if (it.t === "u") {
        var bar = Math.min(r.cells, cols) * cs - gap, at = bar < 200 ? gx + bar + 6 : gx + 4;
        ctx.fillStyle = r.traced ? UNTOUCHED : GREY;
        ctx.fillRect(gx, y + 3, bar, it.h - 6);
        ctx.fillStyle = "#333";
        ctx.fillText(fit(ctx, detail(r), Math.max(0, w - Math.max(at, LABEL_W) - 4)),
                     Math.max(at, LABEL_W + 4), y + it.h / 2);
      } else {
        ctx.fillStyle = "#444";
        ctx.fillText(fit(ctx, detail(r), Math.max(0, w - LABEL_W - 8)), Math.max(gx, LABEL_W) + 2,
                     y + it.h / 2);
      }
    }
    ctx.restore();
    // the label column: region labels on their own line, page addresses beside their row
    ctx.fillStyle = "#fff";
    ctx.fillRect(0, 0, LABEL_W, h);
    ctx.strokeStyle = "#ddd";
    ctx.beginPath();
    ctx.moveTo(LABEL_W - 4.5, 0);
    ctx.lineTo(LABEL_W - 4.5, h);
    ctx.stroke();
    for (i = first; i <= last && i < m.items.length; i++) {
      it = m.items[i];
      r = it.r;
      y = it.y - top;
      if (it.t === "h" || it.t === "u") {
        ctx.font = (it.t === "h" ? "bold " : "") + FONT;
        ctx.fillStyle = it.t === "h" ? "#111" : "#666";
        ctx.textAlign = "left";
        ctx.fillText(fit(ctx, r.label, LABEL_W - 16), 6, y + it.h / 2);
      } else if (it.t === "c" && cs >= 11) {
        ctx.font = Math.min(cs - 2, 11) + "px monospace";
        ctx.fillStyle = "#888";
        ctx.textAlign = "right";
        ctx.fillText(rowAddress(m, r, it.row), LABEL_W - 10, y + cs / 2);
      }
    }
    ctx.textAlign = "left";
    ctx.font = FONT;
  }
  function redraw(m) {
    if (!m.pending) {
      m.pending = true;
      window.requestAnimationFrame(function () { draw(m); });
    }
  }
  function hit(m, x, y) {                   // what is under viewport point (x, y)
    var cy = y + m.view.scrollTop, i = find(m.items, cy);
    if (i < 0) return null;
    var it = m.items[i];
    if (cy >= it.y + it.h) return null;
    var out = {item: it, r: it.r};
    if (it.t === "c" && x >= LABEL_W) {
      var col = Math.floor((x - LABEL_W + m.view.scrollLeft) / m.cell), k = it.row * m.d.columns + col;
      if (col < m.d.columns && k < it.r.cells) out.cell = k;
    }
    return out;
  }
  function tipHtml(m, h) {
    var r = h.r, esc = function (s) {
      return String(s).replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;");
    };
    var lines = ["<b>" + esc(r.label) + "</b>"];
    if (h.cell !== undefined) {
      var per = r.cell_pages, page = BigInt(m.d.page_size);
      if (r._first === undefined) r._first = BigInt(r.first_page);
      var a = r._first + BigInt(h.cell * per) * page;
      lines.push(per > 1 ? ("pages " + hex(a) + " \u2013 " + hex(a + BigInt(per - 1) * page) + " (" + per + ")")
                         : ("page " + hex(a)));
      cellsOf(r);
      var at = r._at[h.cell];
      if (at) {
        var c = r.data[at - 1];
        lines.push(fmt(c[1] + c[2] + c[3]) + " accesses: " + fmt(c[1]) + " loads, " + fmt(c[2]) +
                   " stores, " + fmt(c[3]) + " block events");
      } else {
        lines.push("not accessed");
      }
    } else {
      lines.push(esc(detail(r)));
      if (h.item.t === "g") lines.push(fmt(h.item.to - h.item.from) + " rows of untouched pages folded");
    }
    return lines.join("<br>");
  }
  function setupHeatmap(box) {
    var src = box.querySelector("script.hm-data");
    if (!src) return;
    var m = {d: JSON.parse(src.textContent), view: box.querySelector(".hm-view"),
             space: box.querySelector(".hm-space"), canvas: box.querySelector("canvas"),
             tip: box.querySelector(".hm-tip"), zoomText: box.querySelector(".hm-zoom"),
             fold: true, pending: false};
    var foldBox = box.querySelector("input.hm-fold");
    var best = Math.floor((m.view.clientWidth - LABEL_W - 12) / m.d.columns), start = 8;
    SIZES.forEach(function (s) { if (s <= best && s >= 8) start = s; });
    m.cell = m.home = start;
    layout(m);
    draw(m);
    box.setAttribute("data-drawn", String(m.items.length));
    function zoom(step, ax, ay) {
      var i = SIZES.indexOf(m.cell), size = SIZES[Math.max(0, Math.min(SIZES.length - 1, i + step))];
      zoomTo(size, ax, ay);
    }
    function zoomTo(size, ax, ay) {
      if (size === m.cell) return;
      if (ax === undefined) { ax = LABEL_W; ay = 0; }
      var view = m.view, old = hit(m, Math.max(ax, LABEL_W), ay), it = old ? old.item : null;
      var frac = it ? (ay + view.scrollTop - it.y) / it.h : 0;
      var gridX = (Math.max(ax, LABEL_W) - LABEL_W + view.scrollLeft) / m.cell;
      m.cell = size;
      layout(m);
      if (it) {
        var now = m.at[it.ri + ":" + (it.t === "c" ? it.row : (it.t === "g" ? it.from : "h"))];
        if (now) view.scrollTop = now.y + frac * now.h - ay;
      }
      view.scrollLeft = Math.max(0, gridX * size - (Math.max(ax, LABEL_W) - LABEL_W));
      draw(m);
    }
    each(box.querySelectorAll("button[data-zoom]"), function (b) {
      b.addEventListener("click", function () {
        var z = b.getAttribute("data-zoom");
        if (z === "0") zoomTo(m.home); else zoom(parseInt(z, 10));
      });
    });
    if (foldBox) {
      foldBox.addEventListener("change", function () { m.fold = foldBox.checked; layout(m); draw(m); });
    }
    m.view.addEventListener("scroll", function () { redraw(m); });
    window.addEventListener("resize", function () { layout(m); redraw(m); });
    m.view.addEventListener("wheel", function (e) {
      if (!(e.ctrlKey || e.metaKey)) return;
      e.preventDefault();
      var rect = m.canvas.getBoundingClientRect();
      zoom(e.deltaY < 0 ? 1 : -1, e.clientX - rect.left, e.clientY - rect.top);
    }, {passive: false});
    m.view.addEventListener("keydown", function (e) {
      if (e.key === "+" || e.key === "=") { e.preventDefault(); zoom(1); }
      else if (e.key === "-") { e.preventDefault(); zoom(-1); }
      else if (e.key === "0") { e.preventDefault(); zoomTo(m.home); }
    });
    m.view.addEventListener("mousemove", function (e) {
      var rect = m.canvas.getBoundingClientRect(), x = e.clientX - rect.left, y = e.clientY - rect.top;
      var h = hit(m, x, y);
      if (!h) { m.tip.hidden = true; return; }
      m.tip.innerHTML = tipHtml(m, h);
      m.tip.hidden = false;
      var bx = box.getBoundingClientRect(), left = e.clientX - bx.left + 14, topPx = e.clientY - bx.top + 14;
      if (left + m.tip.offsetWidth > bx.width) left = Math.max(0, e.clientX - bx.left - m.tip.offsetWidth - 8);
      m.tip.style.left = left + "px";
      m.tip.style.top = topPx + "px";
    });
    m.view.addEventListener("mouseleave", function () { m.tip.hidden = true; });
  }

  function start() {
    each(document.querySelectorAll("div.tbl"), setupTable);
    each(document.querySelectorAll("div.hm"), setupHeatmap);
    document.documentElement.classList.add("js");
  }
  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", start);
  else start();
})();
"""
