/* The comparison page: the model-level summary, heatmaps of every model pair with their
 * depth profile, and live progress while it runs.
 *
 * The stored atlas arrives embedded in the page (#atlas-data: per model pair the CKA block
 * and the blocks of every computed quantity named in `has`); while the job is queued or
 * running the page polls GET /v1/comparisons/{id} every second, moves the progress bar, and
 * when the job succeeds reads the finished page and draws its atlas in place. With the
 * random-init baseline, "Colour" switches every heatmap between CKA and CKA above the
 * untrained twins (a diverging scale centred at 0, over the atlas's ±learned_limit). */
(function () {
  "use strict";

  const STATES = window.cka.states;
  const LIVE = STATES.LIVE;
  let released = ""; /* set when your cancel left the comparison to its other requesters */
  const $ = function (id) { return document.getElementById(id); };
  const meta = JSON.parse($("comparison-meta").textContent);
  let atlas = JSON.parse($("atlas-data").textContent);
  let drawCards = [];
  let resizeTimer = 0;
  let colour = "cka";
  let measure = "cka"; /* what every heatmap shows: CKA or another measure the atlas has */

  /* What every heatmap is coloured by, and its scale. */
  function scale() {
    return { colour: colour, limit: atlas.learned_limit || 0.05 };
  }

  function transpose(values) {
    return values.length ? values[0].map(function (_, j) { return values.map(function (r) { return r[j]; }); }) : [];
  }

  /* The CKA block (or the chosen measure's) with rows the layers of a and columns those of b,
   * with the blocks of every computed quantity (interval, null, baselines: CKA's alone). */
  function block(a, b) {
    const out = { a: a, b: b, rows: atlas.layers[a], cols: atlas.layers[b], values: [] };
    out.random_init_draws = atlas.random_init_draws;
    out.words = atlas.verdict_words;
    out.measure = measure;
    out.measureLabel = (atlas.measure_titles || {})[measure] || measure;
    const keys = measure === "cka" ? (atlas.has || []) : [];
    const pick = function (m) { return measure === "cka" ? m.cka : m.measures[measure]; };
    /* the measure's flags raised in the pair (docs/measures.md, "Flags"), each in words */
    const flagsOf = function (m) { return (m.flags || {})[measure] || {}; };
    out.flagLabels = atlas.flag_labels || {};
    atlas.matrices.forEach(function (m) {
      if ((m.a === a && m.b === b) || (m.a === b && m.b === a)) out.undefined = m.undefined || {};
      if (m.a === a && m.b === b) {
        out.values = pick(m);
        out.flags = flagsOf(m);
        keys.forEach(function (k) { out[k] = m[k]; });
      } else if (m.a === b && m.b === a && !(a === b)) {
        out.values = transpose(pick(m));
        out.flags = {};
        Object.entries(flagsOf(m)).forEach(function (f) { out.flags[f[0]] = transpose(f[1]); });
        keys.forEach(function (k) { out[k] = m[k] ? transpose(m[k]) : null; });
      }
    });
    return out;
  }

  function option(select, value) {
    const o = document.createElement("option");
    o.value = value;
    o.textContent = value;
    select.appendChild(o);
  }

  function stats(m) {
    const dl = $("focus-stats");
    dl.replaceChildren();
    const all = [].concat.apply([], m.values).filter(function (v) { return v !== null; });
    function add(term, value) {
      const dt = document.createElement("dt");
      dt.textContent = term;
      const dd = document.createElement("dd");
      dd.textContent = value;
      dl.append(dt, dd);
    }
    if (m.rows.length === m.cols.length && m.a !== m.b) {
      const diag = m.values.map(function (r, i) { return r[i]; }).filter(function (v) { return v !== null; });
      if (diag.length) add("Same-depth mean", (diag.reduce(function (s, v) { return s + v; }, 0) / diag.length).toFixed(3));
    }
    if (all.length) {
      add("Max", Math.max.apply(null, all).toFixed(3));
      add("Min", Math.min.apply(null, all).toFixed(3));
    }
    const undefinedCells = m.rows.length * m.cols.length - all.length;
    if (undefinedCells) add("Undefined cells", String(undefinedCells));
    const flagged = m.rows.reduce(function (n, _, i) {
      return n + m.cols.filter(function (_, j) { return window.CkaHeatmap.flagLines(m, i, j).length; }).length;
    }, 0);
    if (flagged) add("Flagged cells", String(flagged) + " (hatched; docs/measures.md)");
  }

  function renderFocus() {
    const a = $("focus-a").value;
    const b = $("focus-b").value;
    const m = block(a, b);
    const fit = $("focus").parentElement.clientWidth;
    window.CkaHeatmap.draw($("focus"), m, Object.assign({ maxSize: 460, minCell: 12, maxCell: 64, font: 12, showValues: true, fit: fit }, scale()));
    $("focus-json").href = "/v1/comparisons/" + meta.id + "/matrix?a=" + encodeURIComponent(a) + "&b=" + encodeURIComponent(b) +
      (measure === "cka" ? "" : "&measure=" + encodeURIComponent(measure));
    stats(m);
    $("null-legend").classList.toggle("hidden", !(atlas.has || []).includes("p_value"));
    window.CkaProfile.draw($("profile"), m, { fit: $("profile").parentElement.clientWidth });
    $("profile-caption").textContent = m.measureLabel + " per layer of " + a + " against " + b;
    document.querySelectorAll(".heatmap-card").forEach(function (card) {
      const on = (card.dataset.a === a && card.dataset.b === b) || (card.dataset.a === b && card.dataset.b === a);
      card.classList.toggle("selected", on);
    });
  }

  function card(m, pending) {
    const c = document.createElement("button");
    c.type = "button";
    c.className = "heatmap-card";
    c.dataset.a = m.a;
    c.dataset.b = m.b;
    c.title = "Show " + m.a + " × " + m.b + " above";
    const h = document.createElement("h3");
    if (m.a === m.b) {
      h.textContent = m.a;
    } else {
      const x = document.createElement("span");
      x.className = "muted";
      x.textContent = " × ";
      h.append(m.a, x, m.b);
    }
    const host = document.createElement("div");
    host.className = "heatmap-host";
    c.append(h, host);
    pending.push(function () {
      window.CkaHeatmap.draw(host, block(m.a, m.b), Object.assign({ maxSize: 190, maxCell: 26, font: 10 }, scale()));
    });
    c.addEventListener("click", function () {
      $("focus-a").value = m.a;
      $("focus-b").value = m.b;
      renderFocus();
      $("atlas").scrollIntoView({ behavior: "smooth", block: "start" });
    });
    return c;
  }

  function renderAtlas() {
    if (!atlas) return;
    $("atlas").classList.remove("hidden");
    const selA = $("focus-a");
    const selB = $("focus-b");
    selA.replaceChildren();
    selB.replaceChildren();
    atlas.models.forEach(function (name) { option(selA, name); option(selB, name); });
    selA.value = atlas.models[0];
    selB.value = atlas.models[Math.min(1, atlas.models.length - 1)];
    const between = $("grid-between");
    const within = $("grid-within");
    between.replaceChildren();
    within.replaceChildren();
    const pending = [];
    atlas.matrices.forEach(function (m) { (m.a === m.b ? within : between).appendChild(card(m, pending)); });
    between.previousElementSibling.classList.toggle("hidden", !between.children.length);
    between.classList.toggle("hidden", !between.children.length);
    // Draw once the cards are laid out, so each heatmap can fit its card's width.
    drawCards = pending;
    const learned = (atlas.has || []).includes("learned");
    $("colour-by-label").classList.toggle("hidden", !learned);
    if (!learned) colour = "cka";
    $("colour-by").value = colour;
    const measures = atlas.measures || ["cka"];
    const pickMeasure = $("measure-by");
    pickMeasure.replaceChildren();
    measures.forEach(function (name) {
      option(pickMeasure, name);
      pickMeasure.lastChild.textContent = (atlas.measure_titles || {})[name] || name;
    });
    if (!measures.includes(measure)) measure = "cka";
    pickMeasure.value = measure;
    $("measure-by-label").classList.toggle("hidden", measures.length < 2);
    redraw();
    bindSummary();
  }

  /* Every heatmap, the focus and the colour bar, in the current colour. */
  function redraw() {
    drawCards.forEach(function (draw) { draw(); });
    const title = measure === "cka" ? undefined : measure;
    window.CkaHeatmap.colorbar($("colorbar"), 220, colour, scale().limit, title);
    renderFocus();
  }

  /* A click on a cell of the model-level summary shows that pair in the focus view. */
  function bindSummary() {
    document.querySelectorAll(".summary-cell").forEach(function (button) {
      button.addEventListener("click", function () {
        $("focus-a").value = button.dataset.a;
        $("focus-b").value = button.dataset.b;
        renderFocus();
        $("focus").scrollIntoView({ behavior: "smooth", block: "center" });
      });
    });
  }

  function showError(c) {
    $("error-card").classList.remove("hidden");
    $("error-title").textContent = c.status === STATES.CANCELLED ? "Cancelled" : "This comparison failed";
    $("error-text").textContent = c.error || (c.status === STATES.CANCELLED ? "Cancelled before it finished." : "");
    $("progress-card").classList.add("hidden");
  }

  /* The finished page, as the server renders it: its atlas data, summary and details. */
  async function finish() {
    const html = await (await fetch(window.location.href, { credentials: "same-origin" })).text();
    const fresh = new DOMParser().parseFromString(html, "text/html");
    atlas = JSON.parse(fresh.getElementById("atlas-data").textContent);
    [".details", "#summary-card"].forEach(function (selector) {
      const updated = fresh.querySelector(selector);
      const old = document.querySelector(selector);
      if (updated && old) old.replaceWith(updated);
    });
    renderAtlas();
    $("downloads").classList.remove("hidden");
  }

  function update(c) {
    window.cka.setStatus(document.querySelector("#status-pill .pill"), c.status);
    window.cka.setProgress($("progress"), c.progress);
    $("progress-text").textContent = Math.round(c.progress * 100) + " %";
    $("progress-label").textContent =
      c.status === STATES.QUEUED ? "Waiting for a worker" : c.status === STATES.RUNNING ? "Computing" : "Finished";
    $("progress-eta").textContent = c.eta_s !== null && c.eta_s !== undefined && c.status === STATES.RUNNING
      ? "about " + window.cka.formatDuration(c.eta_s) + " left" + (released ? "; " + released : "")
      : released || "\u00a0";
    if (!LIVE.includes(c.status)) {
      $("progress").classList.remove("live");
      const cancel = $("cancel");
      if (cancel) cancel.remove();
    }
    if (c.status === STATES.FAILED || c.status === STATES.CANCELLED) showError(c);
  }

  async function poll() {
    let status = meta.status;
    try {
      const c = (await window.cka.api("GET", "/v1/comparisons/" + meta.id)).data;
      status = c.status;
      update(c);
      if (c.status === STATES.SUCCEEDED) await finish();
    } catch (e) {
      $("progress-eta").textContent = "Could not reach the server (" + e.message + "); retrying…";
    }
    if (LIVE.includes(status)) window.setTimeout(poll, 1000);
  }

  const cancel = $("cancel");
  if (cancel) {
    cancel.addEventListener("click", async function () {
      cancel.disabled = true;
      try {
        const c = (await window.cka.api("POST", "/v1/comparisons/" + meta.id + "/cancel")).data;
        const others = (c.held_by || []).map(function (h) { return h.label || h.requester; });
        if (LIVE.includes(c.status) && others.length) {
          released = "you no longer hold it; it carries on for " + others.join(", ");
        }
        update(c);
      } catch (e) {
        cancel.disabled = false;
        $("progress-eta").textContent = e.status === 401 ? "Sign in to cancel." : e.message;
      }
    });
  }
  $("colour-by").addEventListener("change", function () {
    colour = $("colour-by").value;
    if (colour !== "cka") measure = $("measure-by").value = "cka"; /* CKA's own colour */
    redraw();
  });
  $("measure-by").addEventListener("change", function () {
    measure = $("measure-by").value;
    if (measure !== "cka") colour = $("colour-by").value = "cka";
    redraw();
  });
  $("focus-a").addEventListener("change", renderFocus);
  $("focus-b").addEventListener("change", renderFocus);
  $("focus-swap").addEventListener("click", function () {
    const a = $("focus-a").value;
    $("focus-a").value = $("focus-b").value;
    $("focus-b").value = a;
    renderFocus();
  });

  // Redraw to the new widths when the window changes size (rotating a tablet, say).
  window.addEventListener("resize", function () {
    window.clearTimeout(resizeTimer);
    resizeTimer = window.setTimeout(function () {
      if (!atlas) return;
      drawCards.forEach(function (draw) { draw(); });
      renderFocus();
    }, 200);
  });

  if (atlas) renderAtlas();
  if (LIVE.includes(meta.status)) window.setTimeout(poll, 500);
})();
