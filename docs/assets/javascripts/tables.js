// Names in tables break only between words. Code, and long dotted or snake_case words of text, are cut
// into pieces that end after ". , ( = / |" or a space; tables.css keeps each piece whole and a <wbr>
// between pieces lets the line break there. Without this a table must either break a name anywhere
// (`DDPCommunicatio nHookType`) or grow wider than the page. docs/test_layout.py checks the result.
(() => {
  const PIECE = /[^.,(=/|\s]*(?:[.,(=/|]+|\s+|$)/g;
  const LONG_WORD = /^\S{21,}$/;

  function appendPieces(fragment, text) {
    text.match(PIECE).filter((piece) => piece.length > 0).forEach((piece, index) => {
      if (index > 0) fragment.appendChild(document.createElement("wbr"));
      const span = document.createElement("span");
      span.className = "accel-piece";
      span.textContent = piece;
      fragment.appendChild(span);
    });
  }

  function cut(node) {
    const fragment = document.createDocumentFragment();
    if (node.parentElement.closest("code")) {
      appendPieces(fragment, node.data);
    } else {
      // Text: only long words made of names (`MegatronPlugin.decoder_last_pipeline_num_layers`).
      const words = node.data.split(/(\s+)/);
      if (!words.some((word) => LONG_WORD.test(word) && /[._]/.test(word))) return;
      words.forEach((word) => {
        if (LONG_WORD.test(word) && /[._]/.test(word)) appendPieces(fragment, word);
        else fragment.appendChild(document.createTextNode(word));
      });
    }
    node.replaceWith(fragment);
  }

  function cutTables() {
    document.querySelectorAll(".md-typeset table:not([class]) :is(td, th)").forEach((cell) => {
      const walker = document.createTreeWalker(cell, NodeFilter.SHOW_TEXT);
      const nodes = [];
      for (let node = walker.nextNode(); node; node = walker.nextNode()) nodes.push(node);
      nodes.filter((node) => node.data.trim()).forEach(cut);
    });
  }

  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", cutTables);
  else cutTables();
})();
