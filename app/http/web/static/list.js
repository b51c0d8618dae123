/* The comparisons list: keep the progress of queued and running comparisons live. */
(function () {
  "use strict";
  const STATES = window.cka.states;
  const LIVE = STATES.LIVE;

  async function refresh(row) {
    const id = row.getAttribute("data-comparison-id");
    try {
      const c = (await window.cka.api("GET", "/v1/comparisons/" + id)).data;
      window.cka.setStatus(row.querySelector(".pill"), c.status);
      const bar = row.querySelector(".progress");
      window.cka.setProgress(bar, c.progress);
      if (!LIVE.includes(c.status)) {
        if (bar) bar.remove();
        return false;
      }
    } catch (e) {
      /* a blip: try again on the next round */
    }
    return true;
  }

  async function loop(rows) {
    const states = await Promise.all(rows.map(refresh));
    const still = rows.filter(function (_, i) { return states[i]; });
    if (still.length) window.setTimeout(function () { loop(still); }, 2000);
  }

  document.addEventListener("DOMContentLoaded", function () {
    const rows = Array.from(document.querySelectorAll("tr[data-comparison-id]")).filter(function (r) {
      return r.querySelector(".progress.live");
    });
    if (rows.length) window.setTimeout(function () { loop(rows); }, 1000);
  });
})();
