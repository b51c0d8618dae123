/* cka-atlas page helpers: same-origin REST calls and progress bars.
 *
 * The API token never reaches this script: the login form stored it in an HttpOnly
 * cookie, which the browser sends with these same-origin requests. The X-CKA-CSRF header
 * (which a cross-site form cannot send) tells the server that the page itself asks for a
 * write, so the cookie may authorise it. */
(function () {
  "use strict";

  async function api(method, url, body) {
    const headers = { Accept: "application/json", "X-CKA-CSRF": "1" };
    const options = { method: method, headers: headers, credentials: "same-origin" };
    if (body instanceof FormData) {
      options.body = body; /* multipart: the browser writes the boundary */
    } else if (body !== undefined) {
      headers["Content-Type"] = "application/json";
      options.body = JSON.stringify(body);
    }
    const response = await fetch(url, options);
    const type = response.headers.get("content-type") || "";
    const data = type.includes("json") ? await response.json() : null;
    if (!response.ok) {
      const error = new Error((data && data.detail) || response.statusText || "request failed");
      error.status = response.status;
      error.problem = data;
      throw error;
    }
    return { status: response.status, data: data, headers: response.headers };
  }

  function setProgress(bar, value) {
    if (!bar) return;
    const v = Math.min(1, Math.max(0, Number(value) || 0));
    bar.setAttribute("aria-valuenow", v.toFixed(4));
    bar.setAttribute("aria-valuetext", Math.round(v * 100) + " %");
    const fill = bar.querySelector(".progress-fill");
    if (fill) fill.style.width = (v * 100).toFixed(2) + "%";
  }

  function setStatus(pill, status) {
    if (!pill) return;
    pill.className = "pill status-" + status;
    pill.textContent = status;
  }

  function formatDuration(seconds) {
    const s = Math.max(0, Math.round(seconds));
    if (s < 60) return s + " s";
    if (s < 3600) return Math.floor(s / 60) + " min " + String(s % 60).padStart(2, "0") + " s";
    return Math.floor(s / 3600) + " h " + String(Math.floor((s % 3600) / 60)).padStart(2, "0") + " min";
  }

  // The job states by their enum names (QUEUED, ..., and LIVE: those that may still change),
  // from the JSON that base.html renders from the server's JobState.
  const states = JSON.parse(document.getElementById("job-states").textContent);

  window.cka = {
    api: api, setProgress: setProgress, setStatus: setStatus, formatDuration: formatDuration, states: states,
  };

  document.addEventListener("DOMContentLoaded", function () {
    document.querySelectorAll(".progress").forEach(function (bar) {
      setProgress(bar, bar.getAttribute("aria-valuenow"));
    });
  });
})();
