"""Template requests in other languages than English (deterministic), used only for training.

The prompt data has non-English items, but unevenly: no Arabic, Vietnamese or Romanian math, thin
Chinese code, short arithmetic in no language at all. These templates put the same generic knowledge
in every language: a short calculation ("What is 12 * 7?") and a word problem with numbers are math, a
request for a function or a fix is code, a question about a place or a date ("How many people live
in ...?") and a writing task are chat. They are written from general knowledge of each language, not
copied from any prompt file, and every language gets every domain, so a language never stands in for
a domain. Each example carries its language, so leave-one-language-out holds them out with the
language's prompts.
"""

from __future__ import annotations

import random

from classifier.data import Example

_PROG = ["Python", "JavaScript", "Java", "C++", "Go", "Rust", "SQL", "TypeScript", "C#", "PHP"]

# Per language: math / code / chat templates and the words they are filled with. Placeholders:
# {a} {b} {c} {k} numbers, {name} a person, {task} a programming task, {prog} a programming language,
# {topic} a subject, {place} a city or country.
TEMPLATES: dict[str, dict[str, list[str]]] = {
    "en": {
        "math": [
            "What is {a} * {b}?",
            "What is {a} + {b}?",
            "How much is {a} times {b}?",
            "Calculate {a} - {b} + {c}.",
            "{a} × {b} = ?",
            "What is {a} divided by {k}?",
            "{name} has {a} apples and buys {b} more. How many apples does {name} have now?",
            "A ticket costs {k} dollars. How much do {b} tickets cost?",
            "Solve {k}x + {b} = {c}.",
        ],
        "code": [
            "Write a {prog} function to {task}.",
            "How do I {task} in {prog}?",
            "My {prog} code fails when I try to {task}. How do I fix it?",
        ],
        "tasks": [
            "sort a list",
            "reverse a string",
            "read a file line by line",
            "remove duplicates from a list",
            "count the words in a text",
            "parse a JSON string",
        ],
        "chat": [
            "How many people live in {place}?",
            "When was {place} founded?",
            "Write a short poem about {topic}.",
            "Why is {topic} important?",
            "What is {place} famous for?",
        ],
        "topics": ["the sea", "friendship", "autumn", "music"],
        "places": ["Paris", "Brazil", "Tokyo", "Egypt"],
        "names": ["Anna", "Tom", "Maria"],
    },
    "de": {
        "math": [
            "Was ist {a} * {b}?",
            "Wie viel ist {a} mal {b}?",
            "Berechne {a} + {b} - {c}.",
            "{a} × {b} = ?",
            "Was ergibt {a} geteilt durch {k}?",
            "{name} hat {a} Äpfel und kauft {b} weitere. Wie viele Äpfel hat {name} jetzt?",
            "Ein Buch kostet {k} Euro. Wie viel kosten {b} Bücher?",
            "Löse die Gleichung {k}x + {b} = {c}.",
        ],
        "code": [
            "Schreibe eine {prog}-Funktion, die {task}.",
            "Wie kann ich in {prog} {task}?",
            "Mein {prog}-Code stürzt ab, wenn ich {task} will. Wie behebe ich das?",
        ],
        "tasks": [
            "eine Liste sortiert",
            "einen String umkehrt",
            "eine Datei zeilenweise liest",
            "Duplikate aus einer Liste entfernt",
            "die Wörter in einem Text zählt",
        ],
        "chat": [
            "Wie viele Einwohner hat {place}?",
            "Wann wurde {place} gegründet?",
            "Schreibe ein kurzes Gedicht über {topic}.",
            "Warum ist {topic} wichtig?",
            "Wofür ist {place} bekannt?",
        ],
        "topics": ["das Meer", "Freundschaft", "den Herbst", "Musik"],
        "places": ["Berlin", "Österreich", "Hamburg", "die Schweiz"],
        "names": ["Anna", "Lukas", "Sophie"],
    },
    "es": {
        "math": [
            "¿Cuánto es {a} * {b}?",
            "¿Cuánto es {a} por {b}?",
            "Calcula {a} + {b} - {c}.",
            "{a} × {b} = ?",
            "¿Cuánto es {a} dividido entre {k}?",
            "{name} tiene {a} manzanas y compra {b} más. ¿Cuántas manzanas tiene {name} ahora?",
            "Un libro cuesta {k} euros. ¿Cuánto cuestan {b} libros?",
            "Resuelve la ecuación {k}x + {b} = {c}.",
        ],
        "code": [
            "Escribe una función en {prog} que {task}.",
            "¿Cómo puedo {task2} en {prog}?",
            "Mi código de {prog} falla cuando intento {task2}. ¿Cómo lo arreglo?",
        ],
        "tasks": [
            "ordene una lista",
            "invierta una cadena",
            "lea un archivo línea por línea",
            "elimine los duplicados de una lista",
            "cuente las palabras de un texto",
        ],
        "tasks2": [
            "ordenar una lista",
            "invertir una cadena",
            "leer un archivo línea por línea",
            "eliminar duplicados de una lista",
            "contar las palabras de un texto",
        ],
        "chat": [
            "¿Cuántos habitantes tiene {place}?",
            "¿Cuándo se fundó {place}?",
            "Escribe un poema corto sobre {topic}.",
            "¿Por qué es importante {topic}?",
            "¿Por qué es famosa {place}?",
        ],
        "topics": ["el mar", "la amistad", "el otoño", "la música"],
        "places": ["Madrid", "México", "Buenos Aires", "Colombia"],
        "names": ["Lucía", "Carlos", "Sofía"],
    },
    "fr": {
        "math": [
            "Combien font {a} * {b} ?",
            "Combien font {a} fois {b} ?",
            "Calcule {a} + {b} - {c}.",
            "{a} × {b} = ?",
            "Combien fait {a} divisé par {k} ?",
            "{name} a {a} pommes et en achète {b} de plus. Combien de pommes {name} a-t-il maintenant ?",
            "Un livre coûte {k} euros. Combien coûtent {b} livres ?",
            "Résous l'équation {k}x + {b} = {c}.",
        ],
        "code": [
            "Écris une fonction {prog} qui {task}.",
            "Comment {task2} en {prog} ?",
            "Mon code {prog} plante quand j'essaie de {task2}. Comment le corriger ?",
        ],
        "tasks": [
            "trie une liste",
            "inverse une chaîne",
            "lit un fichier ligne par ligne",
            "supprime les doublons d'une liste",
            "compte les mots d'un texte",
        ],
        "tasks2": [
            "trier une liste",
            "inverser une chaîne",
            "lire un fichier ligne par ligne",
            "supprimer les doublons d'une liste",
            "compter les mots d'un texte",
        ],
        "chat": [
            "Combien d'habitants compte {place} ?",
            "Quand {place} a-t-elle été fondée ?",
            "Écris un court poème sur {topic}.",
            "Pourquoi {topic} est-elle importante ?",
            "Pour quoi {place} est-elle célèbre ?",
        ],
        "topics": ["la mer", "l'amitié", "l'automne", "la musique"],
        "places": ["Paris", "Lyon", "la Belgique", "Marseille"],
        "names": ["Pierre", "Julie", "Lucas"],
    },
    "it": {
        "math": [
            "Quanto fa {a} * {b}?",
            "Quanto fa {a} per {b}?",
            "Calcola {a} + {b} - {c}.",
            "{a} × {b} = ?",
            "Quanto fa {a} diviso {k}?",
            "{name} ha {a} mele e ne compra altre {b}. Quante mele ha {name} adesso?",
            "Un libro costa {k} euro. Quanto costano {b} libri?",
            "Risolvi l'equazione {k}x + {b} = {c}.",
        ],
        "code": [
            "Scrivi una funzione {prog} che {task}.",
            "Come posso {task2} in {prog}?",
            "Il mio codice {prog} va in errore quando provo a {task2}. Come lo correggo?",
        ],
        "tasks": [
            "ordina una lista",
            "inverte una stringa",
            "legge un file riga per riga",
            "rimuove i duplicati da una lista",
            "conta le parole di un testo",
        ],
        "tasks2": [
            "ordinare una lista",
            "invertire una stringa",
            "leggere un file riga per riga",
            "rimuovere i duplicati da una lista",
            "contare le parole di un testo",
        ],
        "chat": [
            "Quanti abitanti ha {place}?",
            "Quando è stata fondata {place}?",
            "Scrivi una breve poesia su {topic}.",
            "Perché {topic} è importante?",
            "Per cosa è famosa {place}?",
        ],
        "topics": ["il mare", "l'amicizia", "l'autunno", "la musica"],
        "places": ["Roma", "Milano", "Napoli", "la Sicilia"],
        "names": ["Marco", "Giulia", "Luca"],
    },
    "pt": {
        "math": [
            "Quanto é {a} * {b}?",
            "Quanto é {a} vezes {b}?",
            "Calcule {a} + {b} - {c}.",
            "{a} × {b} = ?",
            "Quanto é {a} dividido por {k}?",
            "{name} tem {a} maçãs e compra mais {b}. Quantas maçãs {name} tem agora?",
            "Um livro custa {k} reais. Quanto custam {b} livros?",
            "Resolva a equação {k}x + {b} = {c}.",
        ],
        "code": [
            "Escreva uma função em {prog} que {task}.",
            "Como faço para {task2} em {prog}?",
            "Meu código {prog} dá erro quando tento {task2}. Como corrijo?",
        ],
        "tasks": [
            "ordene uma lista",
            "inverta uma string",
            "leia um arquivo linha por linha",
            "remova duplicatas de uma lista",
            "conte as palavras de um texto",
        ],
        "tasks2": [
            "ordenar uma lista",
            "inverter uma string",
            "ler um arquivo linha por linha",
            "remover duplicatas de uma lista",
            "contar as palavras de um texto",
        ],
        "chat": [
            "Quantos habitantes tem {place}?",
            "Quando foi fundada {place}?",
            "Escreva um poema curto sobre {topic}.",
            "Por que {topic} é importante?",
            "Pelo que {place} é famosa?",
        ],
        "topics": ["o mar", "a amizade", "o outono", "a música"],
        "places": ["Lisboa", "São Paulo", "o Brasil", "Porto"],
        "names": ["João", "Ana", "Pedro"],
    },
    "nl": {
        "math": [
            "Wat is {a} * {b}?",
            "Hoeveel is {a} keer {b}?",
            "Bereken {a} + {b} - {c}.",
            "{a} × {b} = ?",
            "Wat is {a} gedeeld door {k}?",
            "{name} heeft {a} appels en koopt er {b} bij. Hoeveel appels heeft {name} nu?",
            "Een boek kost {k} euro. Hoeveel kosten {b} boeken?",
            "Los de vergelijking {k}x + {b} = {c} op.",
        ],
        "code": [
            "Schrijf een {prog}-functie die {task}.",
            "Hoe kan ik in {prog} {task2}?",
            "Mijn {prog}-code crasht als ik {task2} wil. Hoe los ik dat op?",
        ],
        "tasks": [
            "een lijst sorteert",
            "een string omdraait",
            "een bestand regel voor regel leest",
            "dubbele waarden uit een lijst verwijdert",
            "de woorden in een tekst telt",
        ],
        "tasks2": [
            "een lijst sorteren",
            "een string omdraaien",
            "een bestand regel voor regel lezen",
            "dubbele waarden uit een lijst verwijderen",
            "de woorden in een tekst tellen",
        ],
        "chat": [
            "Hoeveel inwoners heeft {place}?",
            "Wanneer is {place} gesticht?",
            "Schrijf een kort gedicht over {topic}.",
            "Waarom is {topic} belangrijk?",
            "Waar staat {place} om bekend?",
        ],
        "topics": ["de zee", "vriendschap", "de herfst", "muziek"],
        "places": ["Amsterdam", "Utrecht", "België", "Rotterdam"],
        "names": ["Daan", "Emma", "Sanne"],
    },
    "ro": {
        "math": [
            "Cât face {a} * {b}?",
            "Cât face {a} ori {b}?",
            "Calculează {a} + {b} - {c}.",
            "{a} × {b} = ?",
            "Cât face {a} împărțit la {k}?",
            "{name} are {a} mere și mai cumpără {b}. Câte mere are {name} acum?",
            "O carte costă {k} lei. Cât costă {b} cărți?",
            "Rezolvă ecuația {k}x + {b} = {c}.",
        ],
        "code": [
            "Scrie o funcție {prog} care {task}.",
            "Cum pot să {task2} în {prog}?",
            "Codul meu {prog} dă eroare când încerc să {task2}. Cum repar asta?",
        ],
        "tasks": [
            "sortează o listă",
            "inversează un șir",
            "citește un fișier linie cu linie",
            "elimină duplicatele dintr-o listă",
            "numără cuvintele dintr-un text",
        ],
        "tasks2": [
            "sortez o listă",
            "inversez un șir",
            "citesc un fișier linie cu linie",
            "elimin duplicatele dintr-o listă",
            "număr cuvintele dintr-un text",
        ],
        "chat": [
            "Câți locuitori are {place}?",
            "Când a fost fondat orașul {place}?",
            "Scrie o poezie scurtă despre {topic}.",
            "De ce este importantă {topic}?",
            "Pentru ce este celebru orașul {place}?",
        ],
        "topics": ["marea", "prietenia", "toamna", "muzica"],
        "places": ["București", "Cluj", "Iași", "Timișoara"],
        "names": ["Andrei", "Maria", "Ioana"],
    },
    "ru": {
        "math": [
            "Сколько будет {a} * {b}?",
            "Сколько будет {a} умножить на {b}?",
            "Вычислите {a} + {b} - {c}.",
            "{a} × {b} = ?",
            "Сколько будет {a} разделить на {k}?",
            "У {name} было {a} яблок, и он купил ещё {b}. Сколько яблок теперь у {name}?",
            "Книга стоит {k} рублей. Сколько стоят {b} книг?",
            "Решите уравнение {k}x + {b} = {c}.",
        ],
        "code": [
            "Напишите функцию на {prog}, которая {task}.",
            "Как {task2} в {prog}?",
            "Мой код на {prog} падает, когда я пытаюсь {task2}. Как это исправить?",
        ],
        "tasks": [
            "сортирует список",
            "переворачивает строку",
            "читает файл построчно",
            "удаляет дубликаты из списка",
            "считает слова в тексте",
        ],
        "tasks2": [
            "отсортировать список",
            "перевернуть строку",
            "прочитать файл построчно",
            "удалить дубликаты из списка",
            "посчитать слова в тексте",
        ],
        "chat": [
            "Сколько жителей в {place}?",
            "Когда был основан {place}?",
            "Напишите короткое стихотворение о {topic}.",
            "Почему {topic} так важна?",
            "Чем знаменит {place}?",
        ],
        "topics": ["море", "дружбе", "осени", "музыке"],
        "places": ["Москва", "Казань", "Новосибирск", "Санкт-Петербург"],
        "names": ["Саши", "Пети", "Маши"],
    },
    "zh": {
        "math": [
            "{a}乘以{b}等于多少？",
            "{a} * {b} 是多少？",
            "计算 {a} + {b} - {c}。",
            "{a} × {b} = ?",
            "{a}除以{k}等于几？",
            "{name}有{a}个苹果，又买了{b}个。{name}现在一共有多少个苹果？",
            "一本书{k}元，买{b}本需要多少钱？",
            "解方程 {k}x + {b} = {c}。",
        ],
        "code": [
            "用{prog}写一个函数，{task}。",
            "在{prog}中怎么{task}？",
            "我的{prog}代码在{task}的时候报错了，怎么修复？",
        ],
        "tasks": ["对列表排序", "反转字符串", "逐行读取文件", "删除列表中的重复元素", "统计文本中的单词数"],
        "chat": [
            "{place}有多少人口？",
            "{place}是哪一年建立的？",
            "写一首关于{topic}的短诗。",
            "为什么{topic}很重要？",
            "{place}以什么闻名？",
        ],
        "topics": ["大海", "友谊", "秋天", "音乐"],
        "places": ["北京", "上海", "杭州", "西安"],
        "names": ["小明", "小红", "李华"],
    },
    "ja": {
        "math": [
            "{a} * {b} はいくつですか？",
            "{a}かける{b}はいくつですか？",
            "{a} + {b} - {c} を計算してください。",
            "{a} × {b} = ?",
            "{a}を{k}で割るといくつですか？",
            "{name}はりんごを{a}個持っていて、さらに{b}個買いました。りんごは全部で何個ですか？",
            "本が1冊{k}円です。{b}冊買うといくらですか？",
            "方程式 {k}x + {b} = {c} を解いてください。",
        ],
        "code": [
            "{prog}で{task}関数を書いてください。",
            "{prog}で{task2}にはどうすればいいですか？",
            "{prog}のコードで{task2}とエラーになります。どう直せばいいですか？",
        ],
        "tasks": [
            "リストを並べ替える",
            "文字列を逆にする",
            "ファイルを一行ずつ読む",
            "リストの重複を削除する",
        ],
        "tasks2": [
            "リストを並べ替える",
            "文字列を逆にする",
            "ファイルを一行ずつ読む",
            "リストの重複を削除する",
        ],
        "chat": [
            "{place}の人口はどれくらいですか？",
            "{place}はいつできましたか？",
            "{topic}についての短い詩を書いてください。",
            "なぜ{topic}は大切なのですか？",
            "{place}は何で有名ですか？",
        ],
        "topics": ["海", "友情", "秋", "音楽"],
        "places": ["東京", "京都", "大阪", "北海道"],
        "names": ["太郎", "花子", "健太"],
    },
    "ko": {
        "math": [
            "{a} * {b}는 얼마인가요?",
            "{a} 곱하기 {b}는 얼마예요?",
            "{a} + {b} - {c}를 계산하세요.",
            "{a} × {b} = ?",
            "{a} 나누기 {k}는 얼마인가요?",
            "{name}는 사과를 {a}개 가지고 있고 {b}개를 더 샀습니다. 사과는 모두 몇 개인가요?",
            "책 한 권이 {k}원입니다. {b}권은 얼마인가요?",
            "방정식 {k}x + {b} = {c}를 푸세요.",
        ],
        "code": [
            "{prog}로 {task} 함수를 작성하세요.",
            "{prog}에서 {task2} 방법은 무엇인가요?",
            "{prog} 코드에서 {task2} 때 오류가 납니다. 어떻게 고치나요?",
        ],
        "tasks": ["리스트를 정렬하는", "문자열을 뒤집는", "파일을 한 줄씩 읽는", "리스트의 중복을 제거하는"],
        "tasks2": ["리스트를 정렬하는", "문자열을 뒤집는", "파일을 한 줄씩 읽는", "리스트의 중복을 제거하는"],
        "chat": [
            "{place}의 인구는 얼마나 되나요?",
            "{place}는 언제 세워졌나요?",
            "{topic}에 대한 짧은 시를 써 주세요.",
            "{topic}는 왜 중요한가요?",
            "{place}는 무엇으로 유명한가요?",
        ],
        "topics": ["바다", "우정", "가을", "음악"],
        "places": ["서울", "부산", "제주도", "경주"],
        "names": ["민수", "지영", "철수"],
    },
    "vi": {
        "math": [
            "{a} * {b} bằng bao nhiêu?",
            "{a} nhân {b} bằng mấy?",
            "Tính {a} + {b} - {c}.",
            "{a} × {b} = ?",
            "{a} chia cho {k} bằng bao nhiêu?",
            "{name} có {a} quả táo và mua thêm {b} quả. Hỏi {name} có tất cả bao nhiêu quả táo?",
            "Một quyển sách giá {k} nghìn đồng. Mua {b} quyển hết bao nhiêu tiền?",
            "Giải phương trình {k}x + {b} = {c}.",
        ],
        "code": [
            "Viết một hàm {prog} để {task}.",
            "Làm thế nào để {task} trong {prog}?",
            "Mã {prog} của tôi bị lỗi khi tôi {task}. Sửa thế nào?",
        ],
        "tasks": [
            "sắp xếp một danh sách",
            "đảo ngược một chuỗi",
            "đọc tệp từng dòng",
            "xóa phần tử trùng lặp trong danh sách",
            "đếm số từ trong văn bản",
        ],
        "chat": [
            "{place} có bao nhiêu dân?",
            "{place} được thành lập khi nào?",
            "Viết một bài thơ ngắn về {topic}.",
            "Tại sao {topic} lại quan trọng?",
            "{place} nổi tiếng vì điều gì?",
        ],
        "topics": ["biển", "tình bạn", "mùa thu", "âm nhạc"],
        "places": ["Hà Nội", "Huế", "Đà Nẵng", "Sài Gòn"],
        "names": ["Lan", "Minh", "Hùng"],
    },
    "ar": {
        "math": [
            "كم يساوي {a} * {b}؟",
            "كم حاصل ضرب {a} في {b}؟",
            "احسب {a} + {b} - {c}.",
            "{a} × {b} = ?",
            "كم يساوي {a} مقسومًا على {k}؟",
            "لدى {name} {a} تفاحة واشترى {b} تفاحات أخرى. كم تفاحة لدى {name} الآن؟",
            "سعر الكتاب {k} دولارات. كم سعر {b} كتب؟",
            "حل المعادلة {k}x + {b} = {c}.",
        ],
        "code": [
            "اكتب دالة بلغة {prog} {task}.",
            "كيف يمكنني {task2} في {prog}؟",
            "الكود الخاص بي في {prog} يعطي خطأ عندما أحاول {task2}. كيف أصلحه؟",
        ],
        "tasks": ["ترتب قائمة", "تعكس سلسلة نصية", "تقرأ ملفًا سطرًا بسطر", "تحذف العناصر المكررة من قائمة"],
        "tasks2": ["ترتيب قائمة", "عكس سلسلة نصية", "قراءة ملف سطرًا بسطر", "حذف العناصر المكررة من قائمة"],
        "chat": [
            "كم عدد سكان {place}؟",
            "متى تأسست {place}؟",
            "اكتب قصيدة قصيرة عن {topic}.",
            "لماذا {topic} مهمة؟",
            "بماذا تشتهر {place}؟",
        ],
        "topics": ["البحر", "الصداقة", "الخريف", "الموسيقى"],
        "places": ["القاهرة", "دبي", "بيروت", "الرياض"],
        "names": ["أحمد", "سارة", "علي"],
    },
    "th": {
        "math": [
            "{a} * {b} เท่ากับเท่าไร",
            "{a} คูณ {b} ได้เท่าไร",
            "จงคำนวณ {a} + {b} - {c}",
            "{a} × {b} = ?",
            "{a} หารด้วย {k} ได้เท่าไร",
            "{name}มีแอปเปิล {a} ผล ซื้อเพิ่มอีก {b} ผล {name}มีแอปเปิลทั้งหมดกี่ผล",
            "หนังสือเล่มละ {k} บาท ซื้อ {b} เล่มต้องจ่ายเท่าไร",
            "จงแก้สมการ {k}x + {b} = {c}",
        ],
        "code": [
            "เขียนฟังก์ชัน {prog} เพื่อ{task}",
            "จะ{task}ใน {prog} ได้อย่างไร",
            "โค้ด {prog} ของฉันเกิดข้อผิดพลาดตอน{task} ต้องแก้อย่างไร",
        ],
        "tasks": ["เรียงลำดับลิสต์", "กลับด้านสตริง", "อ่านไฟล์ทีละบรรทัด", "ลบค่าซ้ำในลิสต์"],
        "chat": [
            "{place}มีประชากรเท่าไร",
            "{place}ก่อตั้งขึ้นเมื่อไร",
            "เขียนกลอนสั้น ๆ เกี่ยวกับ{topic}",
            "ทำไม{topic}จึงสำคัญ",
            "{place}มีชื่อเสียงเรื่องอะไร",
        ],
        "topics": ["ทะเล", "มิตรภาพ", "ฤดูฝน", "ดนตรี"],
        "places": ["กรุงเทพ", "เชียงใหม่", "ภูเก็ต", "ขอนแก่น"],
        "names": ["สมชาย", "มาลี", "วิชัย"],
    },
}


def _fill(template: str, words: dict[str, list[str]], rng: random.Random) -> str:
    a, b, c = rng.randint(2, 99), rng.randint(2, 60), rng.randint(1, 500)
    k = rng.choice([2, 3, 4, 5, 6, 7, 8, 9, 10, 12, 15, 20, 25])
    tasks = words["tasks"]
    i = rng.randrange(len(tasks))
    tasks2 = words.get("tasks2", tasks)
    return template.format(
        a=a,
        b=b,
        c=c,
        k=k,
        name=rng.choice(words["names"]),
        task=tasks[i],
        task2=tasks2[i % len(tasks2)],
        prog=rng.choice(_PROG),
        topic=rng.choice(words["topics"]),
        place=rng.choice(words["places"]),
        person=rng.choice(words.get("persons", words["names"])),
    )


def multilingual_examples(n_per_cell: int = 40, seed: int = 0) -> list[Example]:
    """`n_per_cell` distinct template requests per (language, domain), each tagged with its language."""
    out: list[Example] = []
    for lang in sorted(TEMPLATES):
        words = TEMPLATES[lang]
        for label in ("chat", "code", "math"):
            rng = random.Random(f"classifier-synthetic-ml:{lang}:{label}:{seed}")
            templates = words[label]
            seen: dict[str, None] = {}
            tries = 0
            while len(seen) < n_per_cell and tries < 50 * n_per_cell:
                seen.setdefault(_fill(templates[tries % len(templates)], words, rng))
                tries += 1
            source = f"extra:synthetic_ml_{label}"
            out += [
                Example(text, label, source, "extra", f"{source}/{lang}/{i}", False, lang=lang)
                for i, text in enumerate(seen)
            ]
    return out


# More chat and code shapes per language: questions about people and places (with years and "how
# many" in them: information-seeking, not calculation), travel advice, and short question titles
# about code. {person} is filled from `persons`.
_EXTRA: dict[str, dict[str, list[str]]] = {
    "en": {
        "chat": [
            "Who was {person}?",
            "In which year was {person} born?",
            "Why is {person} famous?",
            "Where is {place}?",
            "How many years did {person} live?",
            "Give me tips for a trip to {place}.",
            "Tell me about the history of {place}.",
        ],
        "code": ["Error when I {task} in {prog}", "{prog}: how to {task}?", "Best way to {task} with {prog}"],
        "persons": ["Napoleon", "Einstein", "Mozart", "Cleopatra", "Shakespeare", "Gandhi"],
    },
    "de": {
        "chat": [
            "Wer war {person}?",
            "In welchem Jahr wurde {person} geboren?",
            "Warum ist {person} berühmt?",
            "Wo liegt {place}?",
            "Wie viele Jahre lebte {person}?",
            "Gib mir Tipps für eine Reise nach {place}.",
            "Erzähl mir etwas über die Geschichte von {place}.",
        ],
        "code": [
            "Fehler beim Sortieren einer Liste in {prog}",
            "{prog}: Datei zeilenweise lesen",
            "Wie entferne ich Duplikate aus einer Liste in {prog}?",
        ],
        "persons": ["Napoleon", "Einstein", "Mozart", "Goethe", "Kleopatra", "Bismarck"],
    },
    "es": {
        "chat": [
            "¿Quién fue {person}?",
            "¿En qué año nació {person}?",
            "¿Por qué es famoso {person}?",
            "¿Dónde está {place}?",
            "¿Cuántos años vivió {person}?",
            "Dame consejos para un viaje a {place}.",
            "Cuéntame la historia de {place}.",
        ],
        "code": ["Error al {task2} en {prog}", "{prog}: cómo {task2}", "Mejor forma de {task2} con {prog}"],
        "persons": ["Napoleón", "Einstein", "Cervantes", "Frida Kahlo", "Cleopatra", "Simón Bolívar"],
    },
    "fr": {
        "chat": [
            "Qui était {person} ?",
            "En quelle année est né {person} ?",
            "Pourquoi {person} est-il célèbre ?",
            "Où se trouve {place} ?",
            "Combien d'années a vécu {person} ?",
            "Donne-moi des conseils pour un voyage à {place}.",
            "Raconte-moi l'histoire de {place}.",
        ],
        "code": [
            "Erreur en essayant de {task2} en {prog}",
            "{prog} : comment {task2}",
            "Meilleure façon de {task2} avec {prog}",
        ],
        "persons": ["Napoléon", "Victor Hugo", "Marie Curie", "Molière", "Einstein", "Jeanne d'Arc"],
    },
    "it": {
        "chat": [
            "Chi era {person}?",
            "In che anno è nato {person}?",
            "Perché {person} è famoso?",
            "Dove si trova {place}?",
            "Quanti anni visse {person}?",
            "Dammi consigli per un viaggio a {place}.",
            "Raccontami la storia di {place}.",
        ],
        "code": [
            "Errore quando provo a {task2} in {prog}",
            "{prog}: come {task2}",
            "Modo migliore per {task2} con {prog}",
        ],
        "persons": ["Napoleone", "Dante", "Leonardo da Vinci", "Galileo", "Verdi", "Garibaldi"],
    },
    "pt": {
        "chat": [
            "Quem foi {person}?",
            "Em que ano nasceu {person}?",
            "Por que {person} é famoso?",
            "Onde fica {place}?",
            "Quantos anos viveu {person}?",
            "Dê-me dicas para uma viagem a {place}.",
            "Conte-me a história de {place}.",
        ],
        "code": ["Erro ao {task2} em {prog}", "{prog}: como {task2}", "Melhor forma de {task2} com {prog}"],
        "persons": ["Napoleão", "Pelé", "Camões", "Einstein", "Santos Dumont", "Pedro Álvares Cabral"],
    },
    "nl": {
        "chat": [
            "Wie was {person}?",
            "In welk jaar werd {person} geboren?",
            "Waarom is {person} beroemd?",
            "Waar ligt {place}?",
            "Hoeveel jaar leefde {person}?",
            "Geef me tips voor een reis naar {place}.",
            "Vertel me over de geschiedenis van {place}.",
        ],
        "code": [
            "Fout bij {task2} in {prog}",
            "{prog}: hoe kan ik {task2}",
            "Beste manier om {task2} met {prog}",
        ],
        "persons": ["Napoleon", "Rembrandt", "Van Gogh", "Erasmus", "Einstein", "Willem van Oranje"],
    },
    "ro": {
        "chat": [
            "Cine a fost {person}?",
            "În ce an s-a născut {person}?",
            "De ce este celebru {person}?",
            "Unde se află {place}?",
            "Câți ani a trăit {person}?",
            "Dă-mi sfaturi pentru o călătorie la {place}.",
            "Povestește-mi istoria orașului {place}.",
        ],
        "code": [
            "Eroare când încerc să {task2} în {prog}",
            "{prog}: cum să {task2}",
            "Cea mai bună metodă să {task2} în {prog}",
        ],
        "persons": ["Napoleon", "Eminescu", "Ștefan cel Mare", "Brâncuși", "Einstein", "Enescu"],
    },
    "ru": {
        "chat": [
            "Кто такой {person}?",
            "В каком году родился {person}?",
            "Чем знаменит {person}?",
            "Где находится {place}?",
            "Сколько лет прожил {person}?",
            "Дайте советы для поездки в {place}.",
            "Расскажите об истории города {place}.",
        ],
        "code": [
            "Ошибка при попытке {task2} на {prog}",
            "{prog}: как {task2}",
            "Как лучше {task2} в {prog}?",
        ],
        "persons": ["Наполеон", "Пушкин", "Толстой", "Гагарин", "Эйнштейн", "Менделеев"],
    },
    "zh": {
        "chat": [
            "{person}是谁？",
            "{person}是哪一年出生的？",
            "{person}为什么有名？",
            "{place}在哪里？",
            "{person}活了多少年？",
            "给我一些去{place}旅游的建议。",
            "介绍一下{place}的历史。",
        ],
        "code": ["{prog}{task}时报错", "{prog}：如何{task}", "用{prog}{task}的最好方法"],
        "persons": ["孔子", "李白", "拿破仑", "爱因斯坦", "秦始皇", "鲁迅"],
    },
    "ja": {
        "chat": [
            "{person}とは誰ですか？",
            "{person}は何年に生まれましたか？",
            "{person}はなぜ有名ですか？",
            "{place}はどこにありますか？",
            "{person}は何年生きましたか？",
            "{place}旅行のアドバイスをください。",
            "{place}の歴史を教えてください。",
        ],
        "code": ["{prog}で{task2}とエラー", "{prog}：{task2}方法", "{prog}で{task2}一番いい方法"],
        "persons": ["織田信長", "夏目漱石", "ナポレオン", "アインシュタイン", "徳川家康", "紫式部"],
    },
    "ko": {
        "chat": [
            "{person}은 누구인가요?",
            "{person}은 몇 년에 태어났나요?",
            "{person}은 왜 유명한가요?",
            "{place}는 어디에 있나요?",
            "{person}은 몇 년 동안 살았나요?",
            "{place} 여행 팁을 알려 주세요.",
            "{place}의 역사를 알려 주세요.",
        ],
        "code": ["{prog}에서 {task2} 때 오류", "{prog}: {task2} 방법", "{prog}로 {task2} 가장 좋은 방법"],
        "persons": ["세종대왕", "이순신", "나폴레옹", "아인슈타인", "김구", "신사임당"],
    },
    "vi": {
        "chat": [
            "{person} là ai?",
            "{person} sinh năm nào?",
            "Tại sao {person} nổi tiếng?",
            "{place} ở đâu?",
            "{person} sống được bao nhiêu năm?",
            "Cho tôi lời khuyên khi du lịch {place}.",
            "Kể cho tôi về lịch sử của {place}.",
        ],
        "code": ["Lỗi khi {task} trong {prog}", "{prog}: cách {task}", "Cách tốt nhất để {task} với {prog}"],
        "persons": ["Hồ Chí Minh", "Trần Hưng Đạo", "Napoléon", "Einstein", "Nguyễn Du", "Lê Lợi"],
    },
    "ar": {
        "chat": [
            "من هو {person}؟",
            "في أي عام ولد {person}؟",
            "لماذا يشتهر {person}؟",
            "أين تقع {place}؟",
            "كم عاما عاش {person}؟",
            "أعطني نصائح لرحلة إلى {place}.",
            "حدثني عن تاريخ {place}.",
        ],
        "code": ["خطأ عند {task2} في {prog}", "{prog}: كيفية {task2}", "أفضل طريقة {task2} باستخدام {prog}"],
        "persons": ["نابليون", "ابن سينا", "صلاح الدين", "أينشتاين", "نجيب محفوظ", "ابن خلدون"],
    },
    "th": {
        "chat": [
            "{person}คือใคร",
            "{person}เกิดปีไหน",
            "ทำไม{person}จึงมีชื่อเสียง",
            "{place}อยู่ที่ไหน",
            "{person}มีชีวิตอยู่กี่ปี",
            "ขอคำแนะนำสำหรับการเที่ยว{place}",
            "เล่าประวัติของ{place}ให้ฟังหน่อย",
        ],
        "code": ["เกิดข้อผิดพลาดตอน{task}ใน {prog}", "{prog}: วิธี{task}", "วิธีที่ดีที่สุดในการ{task}ด้วย {prog}"],
        "persons": ["สุนทรภู่", "พระนเรศวร", "นโปเลียน", "ไอน์สไตน์", "รัชกาลที่ 5", "พระเจ้าตากสิน"],
    },
}
for _lang, _extra in _EXTRA.items():
    TEMPLATES[_lang]["chat"] = TEMPLATES[_lang]["chat"] + _extra["chat"]
    TEMPLATES[_lang]["code"] = TEMPLATES[_lang]["code"] + _extra["code"]
    TEMPLATES[_lang]["persons"] = _extra["persons"]
