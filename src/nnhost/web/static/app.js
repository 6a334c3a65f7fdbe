// The copy buttons of the key page: copy the text of the element named by data-copy.
"use strict";

function copyText(text) {
  if (navigator.clipboard && window.isSecureContext) {
    return navigator.clipboard.writeText(text);
  }
  // Plain-HTTP pages on another host have no Clipboard API: fall back to a selection.
  const area = document.createElement("textarea");
  area.value = text;
  area.setAttribute("readonly", "");
  area.style.position = "fixed";
  area.style.opacity = "0";
  document.body.appendChild(area);
  area.select();
  const done = document.execCommand("copy");
  document.body.removeChild(area);
  return done ? Promise.resolve() : Promise.reject(new Error("copy refused"));
}

document.addEventListener("click", (event) => {
  const button = event.target.closest("button[data-copy]");
  if (!button) return;
  const source = document.querySelector(button.dataset.copy);
  if (!source) return;
  copyText(source.textContent.trim()).then(
    () => { button.textContent = "Copied"; button.classList.add("done"); },
    () => { button.textContent = "Select and copy by hand"; }
  );
});
